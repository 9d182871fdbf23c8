"""ray.placement's rules (`deploy.placement`): what a colocated config refuses, each refusal naming
its fix, before any actor starts; the sync transport it defaults to; its placement bundles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, load_config
from deploy.placement import engine_bundles, learner_slot

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "configs" / "smoke_cpu.yaml"
COLOCATED = ROOT / "deploy" / "configs" / "smoke_cpu_colocated.yaml"


def test_colocated_defaults_to_the_in_place_handover_and_disaggregated_stays_as_it_was():
    cfg = load_config(COLOCATED)
    assert (cfg.ray.placement, cfg.sync.method) == ("colocated", "handover")
    plain = load_config(SMOKE)
    assert (plain.ray.placement, plain.sync.method) == ("disaggregated", "broadcast")
    assert load_config(COLOCATED, ["sync.method=object_store"]).sync.method == "object_store"


@pytest.mark.parametrize(("sets", "fix"), [
    (["rollout.max_staleness=1"], "set rollout.max_staleness=0"),
    (["ray.num_learners=2"], "set ray.num_learners=1"),
    (["rollout.num_workers=2", "ray.env_pools=2"], "set ray.num_learners=2"),
    (["rollout.num_workers=auto", "rollout.max_workers=2"], "set rollout.num_workers to a number"),
    (["sync.method=broadcast"], "use sync.method=handover"),
    (["ray.learner_gpus=1", "ray.rollout_gpus=1"], "both fractions of it"),
    (["ray.learner_gpus=0.5", "ray.rollout_gpus=0"], "both fractions of it"),
    (["ray.learner_gpus=0.7", "ray.rollout_gpus=0.5"], "sum to at most 1"),
    (["learner.lora.enabled=true"], "learner.lora.merge_on_sync=true"),
    (["rollout.loop=async"], "set rollout.loop=lockstep"),
    (["sync.verify=true"], "set sync.verify=false"),
], ids=["staleness", "learners", "learners-per-engine", "elastic", "broadcast", "whole-gpus", "one-side-gpu",
        "oversubscribed", "lora-adapter", "async-loop", "verify"])
def test_refused_combinations_name_the_fix(sets, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config(COLOCATED, sets)


def test_handover_needs_colocated_placement():
    with pytest.raises(ConfigError, match="needs ray.placement=colocated"):
        load_config(SMOKE, ["sync.method=handover"])


def test_a_refusal_is_one_line_and_exit_2_before_any_actor_starts(tmp_path):
    res = subprocess.run([sys.executable, "-m", "deploy", "train", "--config", str(COLOCATED), "--set",
                          "rollout.max_staleness=1", "--set", f"run.output_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and "rollout.max_staleness=0" in res.stderr
    assert not (tmp_path / "run").exists()


def test_tensor_parallel_engines_share_their_gpus_with_one_learner_rank_each():
    cfg = load_config(COLOCATED, ["engine.engine=vllm", "engine.tensor_parallel_size=2", "rollout.num_workers=2",
                                  "ray.env_pools=2", "ray.num_learners=4", "ray.learner_gpus=0.5",
                                  "ray.rollout_gpus=0.4", "ray.learner_cpus=2", "ray.rollout_cpus=1"])
    assert engine_bundles(cfg) == [{"CPU": 3.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]
    assert [learner_slot(cfg, r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert engine_bundles(load_config(COLOCATED)) == [{"CPU": 2.0}]
