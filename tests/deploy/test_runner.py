"""The runner's checks that happen on the driver before any actor starts."""

from __future__ import annotations

import json

import pytest

from deploy.config_loading import ConfigError, load_config
from deploy.runner import run_training


class _NoCluster:
    """Fails the test if the runner gets as far as starting or using a cluster."""

    def __getattr__(self, name):
        raise AssertionError(f"the runner touched the cluster ({name}) before refusing")


def _cfg(tmp_path, model):
    return load_config(None, [f"model.path={model}", f"run.output_dir={tmp_path / 'run'}"])


def test_train_refuses_to_overwrite_an_existing_run(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "success_rate": 0.5}) + "\n")
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ConfigError, match=r"already holds a run.*--resume.*run.output_dir"):
        run_training(_cfg(tmp_path, model), cluster=_NoCluster())
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written, nothing lost
    assert (run / "metrics.jsonl").read_text().startswith('{"step": 1')


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no checkpoint"):
        run_training(_cfg(tmp_path, model), resume=True, cluster=_NoCluster())


def test_missing_model_is_refused_before_the_run_dir_is_written(tmp_path):
    with pytest.raises(ConfigError, match="build-tiny-model"):
        run_training(_cfg(tmp_path, tmp_path / "absent"), cluster=_NoCluster())
    assert not (tmp_path / "run").exists()
