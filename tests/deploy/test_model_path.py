"""model.path is checked and resolved on the driver before any actor starts."""

from __future__ import annotations

import pytest

from deploy.config_loading import ConfigError, resolve_model_path


def test_existing_model_directory_is_made_absolute(tmp_path, monkeypatch):
    model = tmp_path / "runs" / "tiny" / "base"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("runs/tiny/base") == str(model.resolve())


def test_missing_directory_names_the_path_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'runs/tiny/base' is neither a directory.*build-tiny-model"):
        resolve_model_path("runs/tiny/base")


def test_directory_without_config_and_plain_file_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match="is a file"):
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_hub_id_accepted_only_when_cached(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match="Qwen/Qwen3-1.7B"):
        resolve_model_path("Qwen/Qwen3-1.7B")
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-1.7B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert resolve_model_path("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    with pytest.raises(ConfigError, match="neither a directory"):
        resolve_model_path("not a/valid repo id!")
