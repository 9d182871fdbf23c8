"""LoRA on the torch learner (peft on the tiny Qwen2 model, one process): the config and what it
derives, only the adapters train, the reference is the base with the adapters disabled (exactly the
base model's log-probs), the adapter-only and merged weight streams, the peft adapter and merged
exports, and a bit-identical resume from a checkpoint."""

from __future__ import annotations

import pytest
import torch

from learner.batch import collate_rows
from learner.config import LearnerConfig, LoraConfig
from learner.logprobs import response_logprobs
from learner.lora import adapter_stream, adapters_disabled, merged_stream
from learner.worker import LearnerWorker
from weightsync.adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterSpec, read_adapter_dir
from weightsync.stream import parameter_stream

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}


def lora_cfg(**kw) -> LearnerConfig:
    base = {"lr": 1e-2, "use_deepspeed": False, "kl_coef": 0.05, "micro_batch_rows": 4, "shuffle_rows": False,
            "seed": 3, "entropy_coeff": 0.01, "lora": LORA}
    return LearnerConfig(**{**base, **kw})


def base_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """A LoRA learner after two steps (B leaves 0 at the first, A gets a gradient from the second),
    with its rows, its initial parameters and the second step's metrics."""
    from tests.learner.conftest import _make_rows

    rows = _make_rows()
    w = LearnerWorker(lora_cfg(), str(tiny_model_dir))
    before = {n: p.detach().clone() for n, p in w.backend.module.named_parameters()}
    w.train_step(_make_rows(seed=1))
    metrics = w.train_step(rows)
    return w, rows, before, metrics


# ---- config -------------------------------------------------------------------------------------


def test_lora_config_refuses_bad_values():
    for bad, match in [({"rank": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
                       ({"target_modules": ()}, "target_modules")]:
        with pytest.raises(ValueError, match=match):
            LoraConfig(enabled=True, **bad)
    # ref_placement is ignored with LoRA: shard without ZeRO-3 is accepted there, refused without LoRA
    LearnerConfig(use_deepspeed=False, ref_placement="shard", lora=LORA)
    with pytest.raises(ValueError, match="ref_placement=shard"):
        LearnerConfig(use_deepspeed=False, ref_placement="shard")


def test_train_config_derives_the_engines_lora_rank():
    from deploy.config import TrainConfig

    assert TrainConfig().engine.lora_rank is None
    assert TrainConfig(learner={"lora": {"enabled": True, "rank": 12}}).engine.lora_rank == 12
    merged = {"enabled": True, "rank": 12, "merge_on_sync": True}
    assert TrainConfig(learner={"lora": merged}).engine.lora_rank is None  # full (merged) weights travel
    with pytest.raises(ValueError, match="engine.lora_rank=4 contradicts learner.lora"):
        TrainConfig(learner={"lora": {"enabled": True, "rank": 12}}, engine={"lora_rank": 4})


def test_vllm_max_lora_rank_rounds_up_to_a_rank_vllm_serves():
    from rollout_workers.config import vllm_max_lora_rank

    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ValueError, match="exceeds"):
        vllm_max_lora_rank(513)


# ---- training -----------------------------------------------------------------------------------


def test_only_the_adapters_train(trained):
    w, _, before, metrics = trained
    params = dict(w.backend.module.named_parameters())
    adapters = {n for n in params if ".lora_A." in n or ".lora_B." in n}
    assert adapters and {n for n, p in params.items() if p.requires_grad} == adapters
    assert [n for n in params if n not in adapters and not torch.equal(params[n], before[n])] == []
    assert [n for n in adapters if torch.equal(params[n], before[n])] == []  # every adapter moved
    state = w.backend._optimizer.state
    assert len(state) == len(adapters) and all(p.requires_grad for p in state)  # no optimizer state for the base
    assert metrics.grad_norm > 0 and metrics.kl >= 0


def test_reference_is_exactly_the_base_model(trained, tiny_model_dir):
    """The reference pass (adapters disabled) gives the base model's log-probs bit for bit, while the
    policy (adapters on) differs; no reference copy exists."""
    w, rows, _, _ = trained
    assert w.ref_model is None
    batch = collate_rows(rows, pad_token_id=w._pad_id)
    with torch.no_grad():
        ref = w._reference_logp()(batch)
        base = response_logprobs(base_model(tiny_model_dir), batch, temperature=1.0).logp
        policy = w._policy_logp(batch)
    assert torch.equal(ref, base)
    assert (policy - base).abs().max() > 1e-4
    with adapters_disabled(w.backend.module):
        assert torch.equal(w._policy_logp(batch), base)


# ---- weight streams and exports ---------------------------------------------------------------------


def test_adapter_stream_carries_peft_state_dict_names_only(trained):
    from peft import get_peft_model_state_dict

    w, _, _, _ = trained
    metas, stream = adapter_stream(w.backend.module)
    tensors = dict(stream)
    peft_state = get_peft_model_state_dict(w.backend.module)
    assert [m.name for m in metas] == list(tensors) and set(tensors) == set(peft_state)
    for name, t in tensors.items():
        assert torch.equal(t, peft_state[name])
    full = sum(p.numel() for p in w.backend.module.parameters())
    assert sum(t.numel() for t in tensors.values()) < full / 10


def test_merged_stream_equals_peft_merge_and_full_stream_names(trained, tiny_model_dir):
    import copy

    w, _, _, _ = trained
    metas, stream = merged_stream(w.backend.module)
    merged = dict(stream)
    reference = copy.deepcopy(w.backend.module).merge_and_unload()
    want_metas, want = parameter_stream(reference)
    assert metas == want_metas  # the names, shapes and dtypes the plain model's full sync sends
    for name, t in want:
        torch.testing.assert_close(merged[name], t, atol=1e-6, rtol=0, msg=name)
    base_names = [n for n, _ in base_model(tiny_model_dir).named_parameters()]
    assert [m.name for m in metas] == base_names


def test_exports_reload_in_peft_and_transformers(trained, tiny_model_dir, tmp_path):
    """export_adapter: a peft directory that PeftModel.from_pretrained applies on the base with the
    learner's exact log-probs; export_weights: the merged model, reloaded by transformers."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    w, rows, _, _ = trained
    adapter = tmp_path / "adapter"
    w.export_adapter(str(adapter))
    assert {p.name for p in adapter.iterdir()} == {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
    _, spec = read_adapter_dir(adapter)
    assert spec == AdapterSpec(rank=4, alpha=8.0, target_modules=tuple(sorted(LoraConfig().target_modules)))
    batch = collate_rows(rows, pad_token_id=w._pad_id)
    with torch.no_grad():
        ours = w._policy_logp(batch)
        peft = PeftModel.from_pretrained(base_model(tiny_model_dir), str(adapter)).eval()
        assert torch.equal(response_logprobs(peft, batch, temperature=1.0).logp, ours)
        merged = AutoModelForCausalLM.from_pretrained(w.export_weights(str(tmp_path / "hf")), dtype=torch.float32)
        torch.testing.assert_close(response_logprobs(merged.eval(), batch, temperature=1.0).logp, ours,
                                   atol=1e-5, rtol=0)


def test_resume_is_bit_identical(tiny_model_dir, make_rows, tmp_path):
    """Checkpoint after step 1 (adapter + AdamW state only), continue to step 2; a new learner that
    loads the checkpoint trains the same step 2 exactly."""
    rows1, rows2 = make_rows(seed=1), make_rows(seed=2)
    w = LearnerWorker(lora_cfg(), str(tiny_model_dir))
    w.train_step(rows1)
    w.save_checkpoint(str(tmp_path / "ckpt"))
    saved = torch.load(tmp_path / "ckpt" / "learner.pt", weights_only=False)["model"]
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)  # no base weight in a checkpoint
    m2 = w.train_step(rows2)
    want = dict(adapter_stream(w.backend.module)[1])

    again = LearnerWorker(lora_cfg(), str(tiny_model_dir))
    assert again.load_checkpoint(str(tmp_path / "ckpt")) == 1
    m2_again = again.train_step(rows2)
    got = dict(adapter_stream(again.backend.module)[1])
    assert m2_again.loss == m2.loss and m2_again.grad_norm == m2.grad_norm and m2_again.kl == m2.kl
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_full_weight_checkpoint_is_refused_by_a_lora_learner(tiny_model_dir, make_rows, tmp_path):
    full = LearnerWorker(lora_cfg(lora=LoraConfig()), str(tiny_model_dir))
    full.save_checkpoint(str(tmp_path / "full"))
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        LearnerWorker(lora_cfg(), str(tiny_model_dir)).load_checkpoint(str(tmp_path / "full"))
