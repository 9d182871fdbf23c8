"""End to end: `--verbose` brings every actor's engine and framework output back to the console
(without it, it goes to RUN/logs/<actor>.log: tests/test_readme_commands.py checks that on README's
first run).

This run keeps the vLLM engine: what it checks are vLLM's own log lines. It is the smallest run that
still syncs weights into vLLM once (one step of one task group, short episodes, no evaluation),
from the torch learner (`TORCH_LEARNER`: DeepSpeed's own lines are not what it checks)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.shared_runs import TORCH_LEARNER, set_flags
from tests.vllm_logs import VLLM_INFO

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "configs" / "smoke_cpu.yaml"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


ONE_SYNC = ("run.total_steps=1", "eval.at_end=false", "rollout.tasks_per_step=1", "env.max_steps=2")
"""One step has a weight sync (and vLLM's tied-embedding note); nothing else is needed."""


def _train(model: Path, run: Path, *extra: str) -> str:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    sets = set_flags(f"model.path={model}", f"run.output_dir={run}", *ONE_SYNC, *TORCH_LEARNER)
    res = subprocess.run(
        [sys.executable, "-m", "deploy", "train", "--config", str(SMOKE), *sets, *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return res.stdout + res.stderr


def test_verbose_prints_engine_logs(model, tmp_path):
    run = tmp_path / "run"
    console = _train(model, run, "--verbose")
    print(f"\nconsole lines, smoke train --verbose (1 step): {len(console.splitlines())}")
    assert VLLM_INFO.search(console) and "ParallelLMHead" not in console
    assert not (run / "logs").exists()
