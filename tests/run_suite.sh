#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side on the two cores, each running
# its end-to-end tests (`-m e2e`: a local Ray cluster with engines, learners and env actors each,
# about 1.5 cores) one after another. Process A runs the end-to-end files that need the SFT-warmed
# model or README's runs (each built once there: test_demo_resume reruns README's demo) and the
# longest others, with its output in runs/test-e2e.log (printed
# when it ends); process B, on the console, runs everything else first and then the end-to-end
# files listed in E2E_B. The two were balanced on measured times (docs/results.md, "Test suite
# time"). A new end-to-end file goes to A unless listed. Exits non-zero when either fails, or when
# a part collects no test (pytest's 5).
set -u
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
# One torch/OpenMP thread per process (Ray actors set their own from their CPUs): with the two
# processes side by side every core is busy, and a second thread only waits for a busy core; torch's
# threads wait at every op, so an op runs several times slower than on one thread (docs/results.md,
# "Test suite time").
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
E2E_B=(tests/deploy/test_env_smoke.py tests/deploy/test_evaluation_splits.py
       tests/deploy/test_methods_webshop.py tests/deploy/test_e2e_logs.py tests/deploy/test_elastic.py
       tests/deploy/test_weight_sync.py tests/deploy/test_uniskill_analysis.py
       tests/deploy/test_cli_errors.py tests/deploy/test_faults.py tests/deploy/test_lora_smoke.py)
mkdir -p runs
"$PY" -m pytest tests -q -m e2e "${E2E_B[@]/#/--ignore=}" --durations=15 --junitxml=runs/junit-e2e.xml "$@" \
    >runs/test-e2e.log 2>&1 &
a_pid=$!
"$PY" -m pytest tests -q -m "not e2e" --durations=15 --junitxml=runs/junit-rest.xml "$@"
rest=$?
"$PY" -m pytest "${E2E_B[@]}" -q -m e2e --durations=10 --junitxml=runs/junit-e2e-b.xml "$@"
b=$?
echo "== end-to-end tests, process A (runs/test-e2e.log) =="
wait "$a_pid"
a=$?
cat runs/test-e2e.log
echo "suite: not-e2e exit $rest, end-to-end A exit $a, end-to-end B exit $b"
[ "$rest" -eq 0 ] && [ "$a" -eq 0 ] && [ "$b" -eq 0 ]
