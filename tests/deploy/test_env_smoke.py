"""The training loop runs on every environment backend: the embedded WebShop, the real ALFWorld
engine on generated game files, and the embedded simulator loaded from the same files. Each runs
one GRPO step end to end on local Ray (rollout engine, torch learner, env actors) plus
the evaluation, and logs the environment's metrics: exact episode counts, tasks drawn from the
train split, the WebShop score consistent with the archived episodes' raw scores, and evaluation
results keyed by the fixed evaluation tasks and their task types.

The runs use the HF engine (`engine.engine=hf`): these tests are about the environment backends,
not the engine. The game-files run is the one test_evaluation_splits reads (`alfworld_files_run`:
both validation splits evaluated in full), so it is trained once per session."""

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.deploy.shared_runs import CONFIGS, WEBSHOP_GIGPO, alfworld_files_run, shared_run, webshop_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _run(factory, config: Path, model: Path, *extra: str) -> Path:
    """One training step plus the final evaluation (shared by the session's requests for it)."""
    return shared_run(factory, config, f"model.path={model}", "run.total_steps=1", "eval.at_end=true",
                      "run.save_trajectories=true", *extra)


def _read(run: Path) -> tuple[dict, dict[str, dict], list[dict], object]:
    """(step metrics, final evaluation result per evaluated split, trajectories, the resolved config)."""
    from deploy.config import TrainConfig

    (step,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = TrainConfig.model_validate_json((run / "config.resolved.json").read_text())
    splits = cfg.eval.eval_splits
    names = {s: "step_0001.json" if len(splits) == 1 else f"step_0001-{s}.json" for s in splits}
    evaluations = {s: json.loads((run / "eval" / name).read_text()) for s, name in names.items()}
    (archive,) = (run / "trajectories").glob("step_*.jsonl")
    return step, evaluations, [json.loads(line) for line in archive.read_text().splitlines()], cfg


def _eval_tasks(cfg, split: str) -> list:
    from envs.tasks import eval_tasks, task_list

    n = cfg.eval.num_tasks  # None: the whole split
    return eval_tasks(cfg.env, split, n) if n is not None else task_list(cfg.env, split)


def _check_counts(step: dict, evaluations: dict[str, dict], trajs: list[dict], cfg) -> None:
    """Exact episode counts of the step and of each split's evaluation, and evaluation results
    keyed by the fixed evaluation tasks and their types."""
    episodes = cfg.rollout.group_size * cfg.rollout.tasks_per_step
    assert step["episodes"] == len(trajs) == episodes
    assert step["episodes_env_error"] == step["episodes_prompt_too_long"] == 0  # every episode was trained on
    assert step["num_rows"] == step["turns"] == sum(len(t["turns"]) for t in trajs)
    assert step["success_rate"] == pytest.approx(sum(t["success"] for t in trajs) / episodes)
    assert step["policy_version"] == 1 and all(t["policy_version"] == 0 for t in trajs)  # one update, synced
    assert sorted(evaluations) == sorted(cfg.eval.eval_splits)
    for split, evaluation in evaluations.items():
        tasks = _eval_tasks(cfg, split)
        assert tasks and len(tasks) == (cfg.eval.num_tasks or len(tasks))
        assert evaluation["split"] == split and evaluation["k"] == cfg.eval.k
        assert evaluation["num_tasks"] == len(tasks) and evaluation["policy_version"] == 1
        assert evaluation["num_episodes"] == sum(evaluation["end_reasons"].values()) == len(tasks) * cfg.eval.k
        assert not {"env_error", "prompt_too_long"} & set(evaluation["end_reasons"])
        assert sorted(evaluation["per_task"]) == sorted(t.task_id for t in tasks)
        types = Counter(t.task_type for t in tasks)
        assert {name: r["num_tasks"] for name, r in evaluation["per_task_type"].items()} == types
        per_task = evaluation["per_task"].values()
        assert evaluation["avg_at_k"] == pytest.approx(sum(per_task) / len(per_task))
        assert evaluation["pass_at_k"] == pytest.approx(sum(v > 0 for v in per_task) / len(per_task))


def test_webshop_trains_and_evaluates(model, tmp_path_factory):
    from envs.tasks import task_list

    # the WebShop run test_methods_webshop trains (GiGPO on smoke_cpu_webshop.yaml), with its evaluation
    step, evaluations, trajs, cfg = _read(webshop_run(tmp_path_factory, WEBSHOP_GIGPO, model))
    _check_counts(step, evaluations, trajs, cfg)
    evaluation = evaluations[cfg.eval.split]
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
        of_type = [scores[t.task_id] for t in _eval_tasks(cfg, cfg.eval.split) if t.task_type == name]
        assert result["score"] == pytest.approx(sum(of_type) / len(of_type))


BACKENDS = {"smoke_cpu_alfworld_real.yaml": "alfworld", "smoke_cpu_alfworld_files.yaml": "embedded"}


@pytest.mark.parametrize("config", list(BACKENDS))
def test_alfworld_game_files_train_on_both_backends(config, model, tmp_path_factory, alfworld_data_dir):
    if config == "smoke_cpu_alfworld_files.yaml":
        run = alfworld_files_run(tmp_path_factory, model, alfworld_data_dir)
    else:
        run = _run(tmp_path_factory, CONFIGS / config, model, f"env.data_path={alfworld_data_dir}")
    step, evaluations, trajs, cfg = _read(run)
    _check_counts(step, evaluations, trajs, cfg)
    assert cfg.env.data_path == str(alfworld_data_dir) and cfg.env.backend == BACKENDS[config]
    # per-task-type success, no WebShop score
    assert "webshop_task_score" not in step
    assert all(e["score"] is None and e["per_task_score"] == {} for e in evaluations.values())
    assert all(t["task_score"] is None for t in trajs)
    train_root = Path(alfworld_data_dir) / "json_2.1.1" / "train"
    for task in (t["task"] for t in trajs):  # tasks are real game folders of the train split
        assert task["split"] == "train" and (train_root / task["task_id"] / "game.tw-pddl").is_file(), task["task_id"]
        assert task["task_type"] in task["task_id"]
    for t in trajs:  # a win is the env's reward on the last step, nothing else
        assert t["success"] == (t["end_reason"] == "won") == (t["score"] > 0)
