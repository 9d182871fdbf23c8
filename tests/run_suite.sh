#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side on the two cores. The
# end-to-end runs (`-m e2e`: each a local Ray cluster with engines, learners and env actors, about
# 1.5 cores) run one after another in one process, with their output in runs/test-e2e.log (printed
# when they end); everything else runs in the other, on the console. Two training runs at once
# would only fight over the cores. Exits non-zero when either fails, or collects no test (5).
set -u
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
mkdir -p runs
"$PY" -m pytest tests -q -m e2e --durations=15 --junitxml=runs/junit-e2e.xml "$@" >runs/test-e2e.log 2>&1 &
e2e_pid=$!
"$PY" -m pytest tests -q -m "not e2e" --durations=15 --junitxml=runs/junit-rest.xml "$@"
rest=$?
echo "== end-to-end tests (runs/test-e2e.log) =="
wait "$e2e_pid"
e2e=$?
cat runs/test-e2e.log
echo "suite: not-e2e exit $rest, e2e exit $e2e"
[ "$rest" -eq 0 ] && [ "$e2e" -eq 0 ]
