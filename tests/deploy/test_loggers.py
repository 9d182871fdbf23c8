"""`run.loggers`: the sink feeds TensorBoard and Weights & Biases (offline, real wandb package) with
every step record and every evaluation, per split; W&B gets the resolved config and one table per
evaluation, and a resumed run continues the same W&B run."""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploy.evaluation import EvalResult, TypeResult
from deploy.metrics import MetricsSink


def _result(split: str, avg: float) -> EvalResult:
    return EvalResult(label=f"step_0002-{split}", split=split, num_tasks=2, k=2, temperature=0.4, avg_at_k=avg,
                      avg_at_k_se=0.1, pass_at_k=0.5,
                      per_task_type={"look": TypeResult(num_tasks=1, avg_at_k=0.0, pass_at_k=0.0),
                                     "pick": TypeResult(num_tasks=1, avg_at_k=2 * avg, pass_at_k=1.0)},
                      num_episodes=4, end_reasons={"won": 1, "step_limit": 3}, policy_version=2,
                      response_len_mean=12.5, rep4gram_ratio=0.25)


def _tb_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _write_config(run: Path, loggers: list[str]) -> None:
    run.mkdir(parents=True)
    cfg = {"run": {"name": "logger-test", "loggers": loggers, "wandb_project": "agentrl-tests"}, "eval": {"k": 2}}
    (run / "config.resolved.json").write_text(json.dumps(cfg))


def test_tensorboard_gets_steps_and_per_split_evals(tmp_path):
    run = tmp_path / "run"
    _write_config(run, ["tensorboard"])
    sink = MetricsSink(run)
    assert sink.loggers == ("tensorboard",)
    sink.log_step({"step": 1, "success_rate": 0.5, "loss/total": -0.25, "note": "text is skipped"})
    for split, avg in (("valid_seen", 0.25), ("valid_unseen", 0.125)):
        path = sink.log_eval(_result(split, avg), step=2)
        assert EvalResult.model_validate_json(path.read_text()).split == split
    sink.close()
    scalars = _tb_scalars(run)
    assert scalars["success_rate"] == [(1, 0.5)] and scalars["loss/total"] == [(1, -0.25)]
    assert scalars["eval/valid_seen/avg_at_k"] == [(2, 0.25)] and scalars["eval/valid_unseen/avg_at_k"] == [(2, 0.125)]
    assert scalars["eval/valid_unseen/response_len_mean"] == [(2, 12.5)]
    assert "note" not in scalars and not (run / "wandb").exists()
    assert sorted(p.name for p in (run / "eval").glob("*.json")) == ["step_0002-valid_seen.json",
                                                                     "step_0002-valid_unseen.json"]


def _written(path: Path, needles: tuple[bytes, ...], timeout_s: float = 60.0) -> bytes:
    """`path`'s bytes once every needle is in them, or after `timeout_s`. W&B's service process
    (wandb-core) writes the offline run file and closes it when the run's last message arrives,
    which `finish()` sends without waiting (wandb 0.31: `ServiceConnection.inform_finish` only
    publishes), so on a loaded machine the records land a moment after `finish()` returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        data = path.read_bytes()
        if all(n in data for n in needles) or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def test_wandb_offline_gets_config_steps_and_eval_tables_and_resumes_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    _write_config(run, ["tensorboard", "wandb"])
    sink = MetricsSink(run)
    sink.log_step({"step": 1, "success_rate": 0.5})
    sink.log_eval(_result("valid_seen", 0.25), step=2)
    sink.close()
    run_id = (run / "wandb_run_id").read_text().strip()
    (offline,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    (table_file,) = (offline / "files" / "media" / "table" / "eval" / "valid_seen").glob("*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["label", "split", "task_type", "num_tasks", "avg_at_k", "pass_at_k", "score"]
    assert table["data"] == [["step_0002-valid_seen", "valid_seen", "look", 1, 0.0, 0.0, None],
                             ["step_0002-valid_seen", "valid_seen", "pick", 1, 0.5, 1.0, None],
                             ["step_0002-valid_seen", "valid_seen", "all", 2, 0.25, 0.5, None]]
    # the run file holds the records (protobuf): the resolved config and the logged keys are in it
    needles = (b"agentrl-tests", b"logger-test", b"success_rate", b"eval/valid_seen/avg_at_k")
    records = _written(offline / f"run-{run_id}.wandb", needles)
    for needle in needles:
        assert needle in records, needle
    # TensorBoard ran next to it
    assert _tb_scalars(run)["eval/valid_seen/avg_at_k"] == [(2, 0.25)]
    # a resumed run (same run dir) continues the same W&B run id
    sink = MetricsSink(run)
    sink.log_step({"step": 3, "success_rate": 1.0})
    sink.close()
    assert (run / "wandb_run_id").read_text().strip() == run_id
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) >= 1
