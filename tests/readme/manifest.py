"""What the README test does with each command of README.md's ```bash blocks.

Every README command is a key here and every key is a README command (tests/test_readme_commands.py
fails otherwise), so a changed README command cannot go untested. `Run` runs the command as written,
in a scratch copy of the repository, with only the size-shrinking arguments in `extra` appended (and the
HF engine for the laptop job, whose point is Ray's job plumbing, and for the first run's `eval`, whose
point is the evaluation of a checkpoint: the first run's `train` commands are the vLLM run).
`Instead` replaces a command that cannot run here with `shell`, for the reason given.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Check = Callable[[Path], None]
"""An extra assertion on the scratch workspace after the command ran."""


@dataclass(frozen=True)
class Run:
    extra: tuple[str, ...] = ()
    """Appended to the command: arguments that only make it smaller or cheaper (the HF engine where the
    command is not the README's vLLM run)."""
    files: tuple[str, ...] = ()
    """Paths (globs), relative to the workspace, that must exist afterwards."""
    prints: tuple[str, ...] = ()
    """Regular expressions its stdout+stderr must match."""
    check: Check | None = None


@dataclass(frozen=True)
class Instead:
    shell: str
    """What runs in the command's place (`{command}`: the README command, shell-quoted)."""
    reason: str
    files: tuple[str, ...] = ()
    prints: tuple[str, ...] = ()
    check: Check | None = None


Treatment = Run | Instead

FIRST_RUN_HEADING = "A first run"
"""The block whose run directories other tests may read (tests/readme/session.py)."""

HEAD_PORTS = ("6390", "8275", "20001", "52375")
"""The laptop head's ports in the README (GCS, dashboard, Ray client server, dashboard agent): the test
swaps each for a free port, everywhere in the block, so it never meets another cluster of this machine
(tests/test_readme_commands.py checks the README's own ports with Ray's port rules)."""

DEMO_LINE = r"demo success rate \(valid_unseen\): \d\.\d{3} -> \d\.\d{3}"
"""The demo's last line, as README.md states it."""

DEMO_TINY = ("run.total_steps=1", "run.progress=false", "env.max_steps=8", "rollout.group_size=2",
             "rollout.tasks_per_step=2", "eval.num_tasks=2", "eval.k=1", "sft.num_tasks=4", "sft.batch_rows=4",
             "sft.max_steps=2", "engine.kv_cache_memory_bytes=268435456", "ray.envs_per_pool=8", "ray.learner_cpus=1")
"""The demo shrunk to a few tasks, 2 SFT steps and 1 GRPO step (tests/deploy/test_demo_resume.py runs the
demo again on the directory this leaves)."""
DEMO_ARGS = tuple(a for item in DEMO_TINY for a in ("--set", item))


def _steps(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


def _resumed_to_step_4(ws: Path) -> None:
    steps = [json.loads(line) for line in (ws / "runs/smoke/metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and steps[-1]["policy_version"] == 4
    assert (ws / "runs/smoke/checkpoints/step_000004/trainer_state.json").is_file()


def _job_trained_2_steps(ws: Path) -> None:
    assert _steps(ws / "runs/job_smoke/metrics.jsonl") == [1, 2]


def _demo_summary(ws: Path) -> None:
    summary = json.loads((ws / "runs/demo/demo_summary.json").read_text())
    assert {"random init", "after SFT", "after RL", "rl_gain_paired"} <= set(summary)


RUN_DIR = ("runs/smoke/config.resolved.json", "runs/smoke/metrics.jsonl", "runs/smoke/eval/*.json",
           "runs/smoke/checkpoints/step_000002/hf", "runs/smoke/trajectories/step_*.jsonl", "runs/smoke/tb/events.*",
           "runs/smoke/plots/success.png", "runs/smoke/plots/loss.png", "runs/smoke/logs/*")

MANIFEST: dict[str, Treatment] = {
    # --- Two commands ---
    "make demo": Instead(
        "make -n demo | grep -qxF '.venv/bin/python -m deploy demo' && .venv/bin/python -m deploy demo "
        + shlex.join(DEMO_ARGS),
        "the full demo takes about 20 minutes: check that the target runs `python -m deploy demo` and run that "
        "at tiny sizes (1 GRPO step, 2 evaluation tasks, 2 SFT steps)",
        files=("runs/demo/demo_summary.json", "runs/demo/eval/random_init.json", "runs/demo/eval/after_sft.json",
               "runs/demo/plots/demo_success.png"),
        prints=(DEMO_LINE + r"\s*$",), check=_demo_summary),
    "make test": Instead(
        "grep -qE '(^|\\s)make test$' .ci/run && make -n test | grep -q tests/run_suite.sh && grep -qE -- '-m pytest tests( |$)' tests/run_suite.sh",
        "the suite itself (this test is part of it): check that CI's .ci/run calls it and that the target runs "
        "pytest on tests/"),
    # --- A first run ---
    "make install": Instead(
        "make -q install",
        "the environment is installed already: `make -q` exits 0 only when the install stamp of the current "
        "pyproject.toml and Makefile exists"),
    "PY=.venv/bin/python": Run(),
    "$PY -m deploy build-tiny-model --out runs/tiny/base": Run(
        extra=("--num-episodes", "20"), files=("runs/tiny/base/config.json", "runs/tiny/base/tokenizer.json"),
        prints=(r"tiny model written to runs/tiny/base",)),
    "$PY -m deploy sft --model runs/tiny/base --out runs/tiny/sft": Run(
        extra=("--num-tasks", "20", "--set", "sft.epochs=1"),
        files=("runs/tiny/sft/config.json", "runs/tiny/sft/sft_summary.json")),
    "$PY -m deploy train --config deploy/configs/smoke_cpu.yaml --set model.path=runs/tiny/sft": Run(
        files=RUN_DIR, prints=(r"run written to runs/smoke",)),
    "$PY -m deploy eval --config deploy/configs/smoke_cpu.yaml --checkpoint runs/smoke/checkpoints/step_000002 --k 4":
        Run(extra=("--set", "engine.engine=hf"), prints=(r"Avg@4 \d\.\d{3} ± \d\.\d{3}",)),
    "$PY -m deploy train --config deploy/configs/smoke_cpu.yaml --resume --set model.path=runs/tiny/sft "
    "--set run.total_steps=4": Run(files=("runs/smoke/checkpoints/step_000004/hf",), check=_resumed_to_step_4),
    # --- On a cluster with `ray job submit` ---
    "export ALFWORLD_DATA=/shared/alfworld": Run(),
    "hf download Qwen/Qwen3-1.7B": Instead(
        ".venv/bin/hf download --help >/dev/null && grep -qE '^\\s+path: Qwen/Qwen3-1.7B$' "
        "deploy/configs/alfworld_grpo_gpu.yaml",
        "no model hub here: check that the CLI exists and takes `download`, and that the id is the GPU config's model"),
    "ray job submit --address http://<head>:8265 --runtime-env deploy/runtime_env.yaml -- python -m deploy train "
    "--config deploy/configs/alfworld_grpo_gpu.yaml --set run.output_dir=/shared/runs/grpo1": Instead(
        ".venv/bin/python -m tests.readme.cluster_job {command}",
        "needs a GPU cluster: parse the submit options with Ray's CLI and validate the entrypoint's config and "
        "overrides (with ALFWORLD_DATA as exported above) through `deploy validate-config`",
        prints=(r"validate-config exit 0",)),
    # --- the laptop variant: run for real, on free ports ---
    "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled": Run(),
    ".venv/bin/ray start --head --block --port 6390 --dashboard-port 8275 --ray-client-server-port 20001 "
    "--dashboard-agent-listen-port 52375 --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --num-cpus 4 &": Run(),
    "HEAD_PID=$!": Run(),
    "until .venv/bin/ray job list --address http://127.0.0.1:8275 >/dev/null 2>&1; do sleep 2; done": Run(),
    ".venv/bin/ray job submit --address http://127.0.0.1:8275 --runtime-env deploy/runtime_env.yaml -- "
    "$PWD/.venv/bin/python -m deploy train --config deploy/configs/smoke_cpu.yaml "
    "--set model.path=$PWD/runs/tiny/base --set run.output_dir=$PWD/runs/job_smoke": Run(
        extra=("--set", "engine.engine=hf"),
        files=("runs/job_smoke/checkpoints/step_000002/hf",), prints=(r"Job '[^']+' succeeded",),
        check=_job_trained_2_steps),
    "kill $HEAD_PID": Run(),
}
