"""Config tree: YAML + dotted overrides, typos name the key, bad model paths name the fix."""

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, apply_overrides, load_config, save_resolved

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "deploy" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.rollout.group_size >= 1


def test_dotted_overrides_parse_yaml_scalars():
    tree = apply_overrides({"run": {"seed": 1}}, ["run.seed=7", "learner.lr=3e-5", "env.task_types=[a, b]"])
    assert tree == {"run": {"seed": 7}, "learner": {"lr": 3e-5}, "env": {"task_types": ["a", "b"]}}


def test_typo_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'learner\.lrr'"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"unknown key 'rollout\.group_sise'"):
        load_config(None, ["rollout.group_sise=4"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"run\.total_steps"):
        load_config(None, ["run.total_steps=many"])


def test_env_capacity_checked():
    with pytest.raises(ConfigError, match="envs_per_pool"):
        load_config(None, ["rollout.group_size=8", "ray.envs_per_pool=4"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["run.seed=3"])
    path = save_resolved(cfg, tmp_path)
    assert load_config(path) == cfg


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "deploy", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_cli_typo_exits_with_key_name():
    res = _cli("validate-config", "--config", str(ROOT / "deploy/configs/smoke_cpu.yaml"), "--set", "learner.lrr=1")
    assert res.returncode == 2
    assert "learner.lrr" in res.stderr


def test_cli_missing_model_names_the_fix(tmp_path):
    res = _cli("train", "--config", str(ROOT / "deploy/configs/smoke_cpu.yaml"),
               "--set", f"model.path={tmp_path / 'nope'}", "--set", f"run.output_dir={tmp_path / 'run'}")
    assert res.returncode == 2
    assert "build-tiny-model" in res.stderr and "model.path" in res.stderr


def test_base_inheritance_merges_sections(tmp_path):
    (tmp_path / "a.yaml").write_text("run:\n  seed: 1\n  total_steps: 5\nlearner:\n  lr: 0.001\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nrun:\n  seed: 2\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert (cfg.run.seed, cfg.run.total_steps, cfg.learner.lr) == (2, 5, 0.001)
    (tmp_path / "c.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="includes itself"):
        load_config(tmp_path / "c.yaml")


def test_distilling_methods_need_an_env_with_a_state_tracker(monkeypatch):
    import deploy.config

    sets = ["method.name=smrc_sd", "learner.sd.coef=0.1"]
    webshop = load_config(ROOT / "deploy/configs/smoke_cpu_webshop.yaml", sets)
    assert webshop.method.name == "smrc_sd" and webshop.env.name == "webshop"
    monkeypatch.setattr(deploy.config, "TRACKERS", {"alfworld": deploy.config.TRACKERS["alfworld"]})
    with pytest.raises(ConfigError, match="env.name='webshop' has no state tracker"):
        load_config(ROOT / "deploy/configs/smoke_cpu_webshop.yaml", sets)
