"""Every shipped UniSkill config validates with each `uniskill.variant` given as one `--set`, and the
derived learner switches follow the variant (docs/algorithms.md S8, deploy/config_uniskill.py)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, load_config, read_tree
from deploy.config_uniskill import VARIANT_SWITCHES, UniSkillVariant

CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "configs"
UNISKILL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.yaml") if read_tree(p).get("uniskill", {}).get("enabled"))
VARIANTS = typing.get_args(UniSkillVariant)


@pytest.fixture(autouse=True)
def _data_paths(monkeypatch, tmp_path):
    """The cluster configs read their datasets from ${ALFWORLD_DATA} / ${WEBSHOP_DATA}."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld"))
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path / "webshop"))


def test_the_shipped_uniskill_configs_are_found():
    assert {"alfworld_uniskill_gpu.yaml", "smoke_cpu_uniskill.yaml", "smoke_cpu_proposer_only.yaml"} <= set(
        UNISKILL_CONFIGS)
    assert set(VARIANTS) == set(VARIANT_SWITCHES)


@pytest.mark.parametrize("name", UNISKILL_CONFIGS)
def test_every_variant_validates_from_every_uniskill_config(name):
    base = load_config(CONFIGS / name)
    for variant in VARIANTS:
        overrides = [f"uniskill.variant={variant}"]
        if variant == "proposer_only" and base.method.name != "grpo":
            with pytest.raises(ConfigError, match="proposer_only.*method.name=grpo"):
                load_config(CONFIGS / name, overrides)
            overrides.append("method.name=grpo")
        cfg = load_config(CONFIGS / name, overrides)
        sw, p = VARIANT_SWITCHES[variant], cfg.learner.proposer
        assert cfg.uniskill.variant == variant
        assert (p.enabled, p.train_proposer, p.train_actor) == (sw.proposer, sw.train_proposer, sw.train_actor)
        assert (p.use_r_align, p.support_regularizer) == (sw.use_r_align, sw.support_regularizer)
        assert p.lambda_prop == base.learner.proposer.lambda_prop  # a hyperparameter, never contradicted


def test_a_hand_set_derived_switch_that_contradicts_the_variant_names_both_keys():
    with pytest.raises(ConfigError, match="learner.proposer.train_proposer=True contradicts.*actor_only"):
        load_config(CONFIGS / "alfworld_uniskill_gpu.yaml",
                    ["uniskill.variant=actor_only", "learner.proposer.train_proposer=true"])
