"""End to end on local Ray (rollout engine, torch learner, env actors): with
`rollout.max_staleness=1` the smoke configs of GRPO and of UniSkill with SMRC-SD train with step k+1's
rollout in flight while step k trains (docs/pipeline.md): staleness 1 on a prefetched step, never
above 1, nothing prefetched across a checkpoint, evaluation and checkpoint at the end, and a run
resumed from a mid-run checkpoint replays the same task stream and samples as the uninterrupted one.

The GRPO runs use the HF engine (`engine.engine=hf`): they are about the one-step-off pipeline and
resuming it, not the engine. The async agent loop runs on vLLM: that test is about vLLM's async
engine. Every run uses the torch learner (`TORCH_LEARNER`): the pipeline is the same above either
backend. The runs join the test process's shared Ray cluster (`shared_head`), each in a Ray namespace
of its own, as `ray job submit` runs join one."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.shared_runs import ONE_THREAD, TORCH_LEARNER, set_flags, shared_head

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _train(config: Path, model: Path, run: Path, *sets: str, resume: bool = False) -> None:
    cmd = [sys.executable, "-m", "deploy", "train", "--config", str(config), "--set", f"model.path={model}",
           "--set", f"run.output_dir={run}", "--set", "rollout.max_staleness=1",
           "--set", f"ray.namespace={run.parent.name}-{'resumed' if resume else 'first'}",
           *set_flags(*TORCH_LEARNER, ONE_THREAD, *sets), *(["--resume"] if resume else [])]
    res = subprocess.run(cmd, cwd=ROOT, env={**ENV, "RAY_ADDRESS": shared_head()}, capture_output=True, text=True,
                         timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-5000:]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _archive(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]


GRPO_SETS = ("engine.engine=hf", "run.total_steps=3", "run.checkpoint_every=2")


def test_grpo_one_step_off_then_resume(model, tmp_path):
    run = tmp_path / "run"
    _train(CONFIGS / "smoke_cpu.yaml", model, run, *GRPO_SETS)
    assert json.loads((run / "config.resolved.json").read_text())["engine"]["engine"] == "hf"
    steps = _metrics(run)
    assert [s["step"] for s in steps] == [1, 2, 3]
    # step 2 was collected while step 1 trained; step 2 is checkpointed, so step 3 is not prefetched
    assert [s["async/staleness_max"] for s in steps] == [0, 1, 0]
    assert steps[1]["async/staleness_mean"] == 1.0
    assert [t["policy_version"] for t in _archive(run, 2)] == [0] * int(steps[1]["episodes"])
    assert steps[-1]["policy_version"] == 3
    assert all(s["async/learner_wait_s"] >= 0 and s["async/sync_wait_s"] >= 0 for s in steps)
    assert (run / "eval" / "step_0003.json").is_file()
    assert (run / "checkpoints" / "step_000002" / "trainer_state.json").is_file()

    # resume from step 2's checkpoint: step 3 is replayed with the same tasks and the same samples
    before = _archive(run, 3)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    _train(CONFIGS / "smoke_cpu.yaml", model, run, *GRPO_SETS, resume=True)
    assert [s["step"] for s in _metrics(run)] == [1, 2, 3]
    after = _archive(run, 3)
    assert [t["task"] for t in after] == [t["task"] for t in before]
    assert [[u["response_ids"] for u in t["turns"]] for t in after] == \
        [[u["response_ids"] for u in t["turns"]] for t in before]


def test_methods_one_step_off_with_the_async_agent_loop(warm_model, tmp_path):
    """Both asynchronous modes at once: one-step-off training and per-episode coroutines on vLLM's
    async engine (`rollout.loop=async`, docs/pipeline.md), for both methods in one run (UniSkill
    with SMRC-SD routing, smoke_cpu_uniskill_smrc_sd.yaml)."""
    run = tmp_path / "run"
    _train(CONFIGS / "smoke_cpu_uniskill_smrc_sd.yaml", warm_model, run, "rollout.loop=async")
    resolved = json.loads((run / "config.resolved.json").read_text())
    assert resolved["rollout"]["loop"] == "async" and resolved["engine"]["engine"] == "vllm"
    assert resolved["method"]["name"] == "smrc_sd" and resolved["uniskill"]["enabled"]
    steps = _metrics(run)
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["async/staleness_max"] for s in steps] == [0, 1]
    assert steps[-1]["policy_version"] == 2
    assert list((run / "eval").glob("step_0002*.json")) and (run / "checkpoints" / "step_000002").is_dir()
    # SMRC-SD: batch 2 is routed when it arrives, against the success buffer
    assert all("route/teacher_rows" in s for s in steps) and any(s["route/teacher_rows"] > 0 for s in steps)
    # UniSkill: proposals on both steps; step 2's retrieval ran before step 1's commit
    assert all(s["uniskill/proposals"] > 0 for s in steps)
    assert [s["uniskill/bank_commit_seen"] for s in steps] == [0, 0]
