"""The runner's checks that happen on the driver before any actor starts."""

from __future__ import annotations

import json

import pytest

from deploy.config_loading import ConfigError, load_config
from deploy.runner import _prepare_run_dir, run_training


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
    with pytest.raises(ConfigError, match=r"--resume: .* holds no run to continue .*drop --resume"):
        run_training(_cfg(tmp_path, model), resume=True, cluster=_NoCluster())


def test_resume_before_the_first_checkpoint_starts_over(tmp_path):
    """A run stopped (Ctrl-C) before its first checkpoint: --resume starts it over, dropping the
    steps it logged so they are not written twice."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "success_rate": 0.5}) + "\n")
    assert _prepare_run_dir(_cfg(tmp_path, tmp_path), resume=True) is None
    assert (run / "metrics.jsonl").read_text() == ""


def test_resume_picks_the_latest_complete_checkpoint(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        (ckpts / f"step_{step:06d}").mkdir(parents=True)
    for step in (1, 2):  # step 3 died before trainer_state.json, which a checkpoint writes last
        (ckpts / f"step_{step:06d}" / "trainer_state.json").write_text("{}")
    assert _prepare_run_dir(_cfg(tmp_path, tmp_path), resume=True) == ckpts / "step_000002"


def test_missing_model_is_refused_before_the_run_dir_is_written(tmp_path):
    with pytest.raises(ConfigError, match="build-tiny-model"):
        run_training(_cfg(tmp_path, tmp_path / "absent"), cluster=_NoCluster())
    assert not (tmp_path / "run").exists()


def test_a_uniskill_run_without_any_candidate_says_how_to_get_some():
    from deploy.runner import WARM_POLICY_RECIPE, uniskill_idle_hint

    uniskill = load_config(None, ["uniskill.enabled=true"])
    idle = [{"step": 1, "uniskill/candidates": 0.0}, {"step": 2, "uniskill/candidates": 0.0}]
    hint = uniskill_idle_hint(uniskill, idle)
    assert hint is not None and "no step had a proposal candidate" in hint and WARM_POLICY_RECIPE in hint
    assert uniskill_idle_hint(uniskill, [*idle, {"step": 3, "uniskill/candidates": 2.0}]) is None
    assert uniskill_idle_hint(load_config(None, []), idle) is None  # UniSkill off
    assert uniskill_idle_hint(uniskill, []) is None  # no step ran

