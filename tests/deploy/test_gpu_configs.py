"""The shipped GPU configs are the paper runs: every `*_gpu.yaml` validates (UniSkill ones with each
variant given as one `--set`), ALFWorld ones train on the standard data layout named by
${ALFWORLD_DATA} (never generated households) and evaluate on the full valid_seen and valid_unseen
splits in one run, each size fits one 8-GPU node, and the paper's backbones are all there."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, load_config, read_tree
from deploy.config_uniskill import UniSkillVariant

CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "configs"
GPU_CONFIGS = sorted(p.name for p in CONFIGS.glob("*_gpu.yaml"))
VARIANTS = typing.get_args(UniSkillVariant)


@pytest.fixture
def data_env(tmp_path, monkeypatch) -> dict[str, str]:
    dirs = {"ALFWORLD_DATA": str(tmp_path / "alfworld"), "WEBSHOP_DATA": str(tmp_path / "webshop")}
    for name, path in dirs.items():
        Path(path).mkdir()
        monkeypatch.setenv(name, path)
    return dirs


def test_the_paper_backbones_have_configs():
    models = {name: load_model(name) for name in GPU_CONFIGS}
    assert {"Qwen/Qwen3-1.7B", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct"} <= set(models.values())
    assert {"alfworld_grpo_gpu.yaml", "alfworld_grpo_3b_gpu.yaml", "alfworld_grpo_7b_gpu.yaml",
            "alfworld_fullpath_sd_3b_gpu.yaml", "alfworld_smrc_sd_3b_gpu.yaml", "alfworld_uniskill_7b_gpu.yaml",
            "alfworld_uniskill_3b_gpu.yaml", "webshop_uniskill_7b_gpu.yaml"} <= set(GPU_CONFIGS)


def load_model(name: str) -> str:
    tree = read_tree(CONFIGS / name)
    return tree["model"]["path"]


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_every_gpu_config_validates_on_real_data(name, data_env):
    cfg = load_config(CONFIGS / name)
    if cfg.env.name == "alfworld":
        # real game files, never generated households; ${ALFWORLD_DATA} expanded from the environment
        assert cfg.env.data_path == data_env["ALFWORLD_DATA"]
        assert cfg.env.backend == "embedded"  # the simulator on the game files, step-identical to the real engine
        assert cfg.eval.eval_splits == ("valid_seen", "valid_unseen") and cfg.eval.num_tasks is None  # full splits
    # one 8-GPU node: engines (tensor-parallel GPUs each) plus learner ranks
    r = cfg.ray
    assert cfg.rollout.num_workers * r.rollout_gpus + r.num_learners * r.learner_gpus <= 8
    assert cfg.engine.engine == "vllm" and cfg.learner.dtype == "bfloat16"
    # the learner memory settings: checkpointing everywhere, token-budget micro-batches, broadcast sync
    assert cfg.learner.gradient_checkpointing and cfg.learner.max_tokens_per_micro_batch is not None
    assert cfg.sync.method == ("handover" if r.placement == "colocated" else "broadcast")
    assert cfg.run.keep_checkpoints is not None
    if r.placement == "colocated":  # one engine rank and one learner rank on each of the 8 GPUs
        assert r.num_learners == cfg.rollout.num_workers * cfg.engine.tensor_parallel_size == 8
    if cfg.model.path == "Qwen/Qwen2.5-7B-Instruct" and not cfg.learner.lora.enabled:
        # ZeRO-2 leaves no room for activations at 7B (comment in the config); the reference sharded too
        assert cfg.learner.zero_stage == 3 and cfg.learner.ref_placement == "shard"
    if cfg.uniskill.enabled and cfg.model.path == "Qwen/Qwen2.5-7B-Instruct":
        assert cfg.run.total_steps == 250  # the paper's UniSkill run


@pytest.mark.parametrize("name", [n for n in GPU_CONFIGS if read_tree(CONFIGS / n).get("uniskill", {}).get("enabled")
                                  or "uniskill" in n])
def test_every_uniskill_gpu_config_validates_with_each_variant(name, data_env):
    for variant in VARIANTS:
        overrides = [f"uniskill.variant={variant}"]
        if variant == "proposer_only" and load_config(CONFIGS / name).method.name != "grpo":
            overrides.append("method.name=grpo")
        assert load_config(CONFIGS / name, overrides).uniskill.variant == variant


def test_an_unset_data_variable_names_the_variable_and_the_key(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ConfigError, match=r"env.data_path='\$\{ALFWORLD_DATA\}' needs the environment variable "
                                          r"ALFWORLD_DATA.*export ALFWORLD_DATA="):
        load_config(CONFIGS / "alfworld_grpo_gpu.yaml")
    monkeypatch.setenv("ALFWORLD_DATA", "")  # empty counts as unset
    with pytest.raises(ConfigError, match="ALFWORLD_DATA"):
        load_config(CONFIGS / "alfworld_smrc_sd_gpu.yaml")
    # an explicit override replaces the reference before expansion
    cfg = load_config(CONFIGS / "alfworld_grpo_gpu.yaml", ["env.data_path=/data/alfworld"])
    assert cfg.env.data_path == "/data/alfworld"


def _named_configs(text: str) -> set[str]:
    """Every `name.yaml` in backticks, with shell-style {a,b} alternatives expanded."""
    import itertools
    import re

    names = set()
    for token in re.findall(r"`([^`\s]*\.yaml)", text):
        parts = re.split(r"\{([^}]*)\}", token)  # literal, alternatives, literal, ...
        choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
        names.update("".join(c) for c in itertools.product(*choices))
    return {Path(n).name for n in names}


def test_every_config_named_in_the_paper_grid_exists():
    text = (CONFIGS.parents[1] / "docs" / "paper_grid.md").read_text()
    named = _named_configs(text)
    assert {"alfworld_smrc_sd_gpu.yaml", "smoke_cpu_webshop_routing_only.yaml", "webshop_sdar_gpu.yaml"} <= named
    assert _named_configs("`a_{x,y}_b.yaml` and `c.yaml`") == {"a_x_b.yaml", "a_y_b.yaml", "c.yaml"}
    missing = sorted(n for n in named if "*" not in n and not (CONFIGS / n).is_file())
    assert not missing, f"docs/paper_grid.md names configs that do not exist: {missing}"


def test_lora_gpu_configs_fit_two_gpus(data_env):
    """The LoRA rows (UniSkill 7B, SMRC-SD 7B): one learner GPU and one engine GPU, the engine
    serving adapters of the learner's rank, and the same method as their full-weight rows."""
    lora = {"alfworld_uniskill_7b_lora_gpu.yaml": "alfworld_uniskill_7b_gpu.yaml",
            "alfworld_smrc_sd_7b_lora_gpu.yaml": "alfworld_smrc_sd_gpu.yaml"}
    assert set(lora) <= set(GPU_CONFIGS)
    for name, full_name in lora.items():
        cfg, full = load_config(CONFIGS / name), load_config(CONFIGS / full_name)
        r = cfg.ray
        assert r.num_learners * r.learner_gpus + cfg.rollout.num_workers * r.rollout_gpus == 2
        assert cfg.learner.lora.enabled and not cfg.learner.lora.merge_on_sync
        assert cfg.engine.lora_rank == cfg.learner.lora.rank and cfg.model.path == "Qwen/Qwen2.5-7B-Instruct"
        assert (cfg.method, cfg.uniskill.enabled, cfg.learner.sd) == (full.method, full.uniskill.enabled, full.learner.sd)
