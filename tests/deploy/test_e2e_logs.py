"""End to end: a smoke `train` keeps the console for the run (stages, the run directory) and sends
every actor's engine and framework output to RUN/logs/<actor>.log; `--verbose` brings it back to
the console.

These runs keep the vLLM engine: what they check are vLLM's own log lines. Each is the smallest run
that still syncs weights into vLLM once (one step of one task group, short episodes, no evaluation)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "configs" / "smoke_cpu.yaml"
VLLM_INFO = re.compile(r"\bINFO \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]")  # vLLM's own record format

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


ONE_SYNC = ("run.total_steps=1", "eval.at_end=false", "rollout.tasks_per_step=1", "env.max_steps=2")
"""One step has a weight sync (and vLLM's tied-embedding note); nothing else is needed."""


def _train(model: Path, run: Path, *extra: str) -> str:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    sets = [a for s in (f"model.path={model}", f"run.output_dir={run}", *ONE_SYNC) for a in ("--set", s)]
    res = subprocess.run(
        [sys.executable, "-m", "deploy", "train", "--config", str(SMOKE), *sets, *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return res.stdout + res.stderr


def test_engine_logs_go_to_run_logs(model, tmp_path):
    run = tmp_path / "run"
    console = _train(model, run)
    print(f"\nconsole lines, smoke train (1 step): {len(console.splitlines())}")

    logs = run / "logs"
    names = {p.name for p in logs.glob("*.log")}
    assert {"driver.log", "rollout_worker_0.log", "learner_rank0.log", "env_pool_0.log"} <= names, names
    worker = (logs / "rollout_worker_0.log").read_text()
    assert VLLM_INFO.search(worker), worker[:2000]
    # vLLM's "ParallelLMHead: Failed to load weights" after every sync of a tied-embedding model is
    # harmless and filtered out (rollout_workers/engines/vllm_sync.py), in the log as on the console
    assert "ParallelLMHead" not in worker
    assert "Started a local Ray instance" in (logs / "driver.log").read_text()

    assert "ParallelLMHead" not in console
    assert not VLLM_INFO.search(console), console[-3000:]
    assert "NUMA binding" not in console and "reduce_op" not in console
    assert "run written to" in console and "engine and framework logs:" in console


def test_verbose_prints_engine_logs(model, tmp_path):
    run = tmp_path / "run"
    console = _train(model, run, "--verbose")
    print(f"\nconsole lines, smoke train --verbose (1 step): {len(console.splitlines())}")
    assert VLLM_INFO.search(console) and "ParallelLMHead" not in console
    assert not (run / "logs").exists()
