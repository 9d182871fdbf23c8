"""Config tree: YAML + dotted overrides, typos name the key, bad model paths name the fix."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, apply_overrides, config_keys, load_config, save_resolved

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "deploy" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path, tmp_path, monkeypatch):
    for name in ("ALFWORLD_DATA", "WEBSHOP_DATA"):  # the GPU configs read their data root from these
        monkeypatch.setenv(name, str(tmp_path / name))
    cfg = load_config(path)
    assert cfg.rollout.group_size >= 1


def test_dotted_overrides_parse_yaml_scalars():
    tree = apply_overrides({"run": {"seed": 1}}, ["run.seed=7", "learner.lr=3e-5", "env.task_types=[a, b]"])
    assert tree == {"run": {"seed": 7}, "learner": {"lr": 3e-5}, "env": {"task_types": ["a", "b"]}}


def test_typo_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=rf"unknown config key learner\.lrr \(from {bad}\); did you mean learner\.lr\b"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"unknown config key rollout\.group_sise \(from --set rollout\.group_sise\); "
                                          r"did you mean rollout\.group_size\b"):
        load_config(None, ["rollout.group_sise=4"])
    with pytest.raises(ConfigError, match=r"unknown config key learnr\.lr \(from --set learnr\.lr\); did you mean learner\.lr\b"):
        load_config(None, ["learnr.lr=0.1"])


def test_config_keys_cover_nested_sections():
    keys = config_keys()
    assert {"run.total_steps", "learner.lr", "learner.sd", "learner.sd.coef", "uniskill.bank.top_k"} <= set(keys)
    assert len(keys) == len(set(keys))


def test_set_without_equals_names_the_syntax():
    with pytest.raises(ConfigError, match=r"--set 'run\.total_steps' has no '='.*section\.key=value"):
        load_config(None, ["run.total_steps"])


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


def test_matchers_that_need_a_state_tracker_are_refused_for_an_env_without_one(monkeypatch):
    from envs.webshop.plugin import WebShopPlugin

    sets = ["method.name=smrc_sd", "learner.sd.coef=0.1"]
    webshop = load_config(ROOT / "deploy/configs/smoke_cpu_webshop.yaml", sets)
    assert webshop.method.name == "smrc_sd" and webshop.env.name == "webshop"
    monkeypatch.setattr(WebShopPlugin, "tracker", lambda self: None)  # an env that provides no tracker
    with pytest.raises(ConfigError, match="method.matcher='structured' .* env.name='webshop' has no state tracker "
                                          ".* set method.matcher to history or observation"):
        load_config(ROOT / "deploy/configs/smoke_cpu_webshop.yaml", sets)
    generic = load_config(ROOT / "deploy/configs/smoke_cpu_webshop.yaml", [*sets, "method.matcher=history"])
    assert generic.method.matcher == "history"


def test_env_references_expand_everywhere_and_an_unset_one_names_variable_and_key():
    from deploy.config_loading import expand_env

    env = {"DATA": "/d", "RUN": "r1"}
    tree = {"env": {"data_path": "${DATA}/json"}, "run": {"name": "x-${RUN}-${RUN}", "seed": 3},
            "rollout": {"stop": ["${RUN}", "$RUN"]}}
    assert expand_env(tree, env) == {"env": {"data_path": "/d/json"}, "run": {"name": "x-r1-r1", "seed": 3},
                                     "rollout": {"stop": ["r1", "$RUN"]}}  # only ${NAME} is a reference
    with pytest.raises(ConfigError, match=r"rollout.stop\[0\]='\$\{NOPE\}' needs the environment variable NOPE"):
        expand_env({"rollout": {"stop": ["${NOPE}"]}}, env)


def test_env_references_in_overrides_expand(tmp_path, monkeypatch):
    monkeypatch.setenv("H6_GAMES", str(tmp_path))
    cfg = load_config(None, ["env.data_path=${H6_GAMES}", "eval.num_tasks=all"])
    assert cfg.env.data_path == str(tmp_path) and cfg.eval.num_tasks is None


def test_eval_splits_keep_split_compatible_and_refuse_contradictions():
    cfg = load_config(None, ["eval.splits=[valid_seen, valid_unseen]"])
    assert cfg.eval.eval_splits == ("valid_seen", "valid_unseen") and cfg.eval.split == "valid_seen"
    old = load_config(None, ["eval.split=valid_seen"])  # single-split configs are unchanged
    assert old.eval.eval_splits == ("valid_seen",) and old.eval.splits is None
    with pytest.raises(ConfigError, match=r"eval.split='train' is not among eval.splits"):
        load_config(None, ["eval.split=train", "eval.splits=[valid_seen]"])
    with pytest.raises(ConfigError, match="each once"):
        load_config(None, ["eval.splits=[valid_seen, valid_seen]"])
    with pytest.raises(ConfigError, match="must be a list"):
        load_config(None, ["eval.splits=valid_seen"])


def test_all_eval_tasks_needs_a_finite_task_set():
    with pytest.raises(ConfigError, match=r"eval.num_tasks=all .* generated households .* set eval.num_tasks=<N>"):
        load_config(None, ["eval.num_tasks=all"])
    cfg = load_config(None, ["env.name=webshop", "eval.num_tasks=all"])  # a finite goal list
    assert cfg.eval.num_tasks is None


def test_wandb_logger_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"wandb package is not installed: pip install '\.\[wandb\]'"):
        load_config(None, ["run.loggers=[tensorboard, wandb]"])
    assert load_config(None, ["run.loggers=[tensorboard]"]).run.loggers == ("tensorboard",)
    with pytest.raises(ConfigError, match=r"run.loggers.0"):
        load_config(None, ["run.loggers=[mlflow]"])


def test_a_hub_id_missing_from_the_cache_names_the_model_and_how_to_provide_it(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from deploy.config_loading import resolve_model_path

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match=r"model.path 'Qwen/Qwen2.5-7B-Instruct' \(a Hugging Face hub id\) is not in "
                                          r"the local Hugging Face cache \(.*hub\), and runs never download "
                                          r"\(HF_HUB_OFFLINE=1.*huggingface-cli download Qwen/Qwen2.5-7B-Instruct"
                                          r".*--set model.path="):
        resolve_model_path("Qwen/Qwen2.5-7B-Instruct")


def test_escaped_surrogate_pairs_join_and_a_lone_surrogate_names_the_key(tmp_path):
    """YAML reads "\\ud800\\udc00" as two surrogates; the loader joins them into one character, so
    the resolved config can be written, and refuses an unpaired one by key."""
    cfg = load_config(None, ['run.name="\\ud800\\udc00x"'])
    assert cfg.run.name == "\U00010000x"
    save_resolved(cfg, tmp_path)
    with pytest.raises(ConfigError, match=r"run\.name=.*lone UTF-16 surrogate"):
        load_config(None, ['run.name="\\udc00"'])


@pytest.mark.parametrize("key", ["ray.rollout_gpus", "ray.learner_gpus"])
def test_broadcast_sync_refuses_shared_gpus_and_names_the_alternative(key):
    # NCCL refuses two ranks of one group on one GPU: fractional GPUs cannot broadcast
    escaped = re.escape(f"{key}=0.5")
    with pytest.raises(ConfigError, match=rf"sync\.method=broadcast.*{escaped} shares GPUs; set ray\.placement="
                                          r"colocated \(in-place handover\) or sync\.method=object_store"):
        load_config(None, [f"{key}=0.5", "sync.method=broadcast"])
    assert load_config(None, [f"{key}=0.5", "sync.method=object_store"]).sync.method == "object_store"
    assert load_config(None, [f"{key}=1", "sync.method=broadcast"]).sync.method == "broadcast"
    assert load_config(None, [f"{key}=0", "sync.method=broadcast"]).sync.method == "broadcast"  # CPU: gloo
