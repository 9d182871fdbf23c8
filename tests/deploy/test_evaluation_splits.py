"""The paper-config evaluation path end to end: `env.data_path: ${ALFWORLD_DATA}` expanded from the
environment, the embedded simulator on ALFWorld game files, evaluation on the FULL valid_seen and
valid_unseen splits in one run (one eval JSON, TensorBoard tag set and plot line per split), and the
W&B logger offline next to TensorBoard. One GRPO step on local Ray (the torch learner).

The run is `alfworld_files_run`, shared with test_env_smoke (which checks its step and evaluation
counts), on the HF engine (`engine.engine=hf`): this test is about the evaluation and logging
path, not the engine."""

import json

import pytest

from tests.deploy.shared_runs import alfworld_files_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def test_full_split_evaluation_on_game_files_with_wandb_offline(model, tmp_path_factory, alfworld_data_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from envs.config import EnvConfig
    from envs.tasks import task_list

    run = alfworld_files_run(tmp_path_factory, model, alfworld_data_dir)
    resolved = json.loads((run / "config.resolved.json").read_text())
    assert resolved["env"]["data_path"] == str(alfworld_data_dir)  # expanded before the run started
    env_cfg = EnvConfig(backend="embedded", data_path=str(alfworld_data_dir))
    tb = EventAccumulator(str(run / "tb"))
    tb.Reload()
    for split in ("valid_seen", "valid_unseen"):
        result = json.loads((run / "eval" / f"step_0001-{split}.json").read_text())
        whole = task_list(env_cfg, split)  # every game of the split, k samples each
        assert result["split"] == split and sorted(result["per_task"]) == sorted(t.task_id for t in whole)
        assert result["num_tasks"] == len(whole) and result["num_episodes"] == len(whole) * resolved["eval"]["k"]
        assert result["response_len_mean"] > 0 and 0.0 <= result["rep4gram_ratio"] <= 1.0
        (point,) = tb.Scalars(f"eval/{split}/avg_at_k")
        assert (point.step, point.value) == (1, pytest.approx(result["avg_at_k"]))
    run_id = (run / "wandb_run_id").read_text().strip()
    (offline,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    tables = sorted(p.parent.name for p in (offline / "files" / "media" / "table" / "eval").glob("*/*.table.json"))
    assert tables == ["valid_seen", "valid_unseen"]
    assert b"smoke-alfworld-files" in (offline / f"run-{run_id}.wandb").read_bytes()  # the resolved config's run name
    assert (run / "plots" / "success.png").stat().st_size > 0
