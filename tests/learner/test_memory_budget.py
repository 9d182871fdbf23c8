"""Learner memory knobs that must not change the update (learner.max_tokens_per_micro_batch,
gradient_checkpointing, logprob_chunk_size, log_entropy): token-budget packing in
`learner.sharding` (pure) and the same loss and weights as fixed-row micro-batches through the
plain-torch worker (same code path as DeepSpeed apart from the optimiser owner)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.config import LearnerConfig
from learner.sharding import pack_by_tokens, shard_micro_batches
from learner.worker import LearnerWorker


def test_pack_by_tokens_respects_the_budget():
    assert pack_by_tokens([1, 2, 2, 3, 3, 9], 6) == [3, 2, 1]  # 3 rows x 2, 2 x 3, then 9 alone
    assert pack_by_tokens([1, 2, 2, 3, 5], 6) == [3, 1, 1]
    assert pack_by_tokens([10, 12], 6) == [1, 1]  # over-budget rows run alone
    assert pack_by_tokens([], 6) == []


budget_cases = st.tuples(
    st.lists(st.integers(1, 40), min_size=1, max_size=40),  # row lengths
    st.integers(1, 4),  # world size
    st.integers(1, 80),  # token budget
    st.randoms(use_true_random=False),
)


@settings(max_examples=200, deadline=None)
@given(budget_cases)
def test_token_budget_owns_every_row_once_with_equal_counts(case):
    lengths_list, world, budget, rnd = case
    lengths = torch.tensor(lengths_list)
    n = len(lengths_list)
    rows = torch.tensor(rnd.sample(range(n), rnd.randint(1, n)))
    per_rank = [
        shard_micro_batches(lengths, rows, rank=r, world_size=world, micro_rows=2, max_tokens=budget)
        for r in range(world)
    ]
    assert len({len(c) for c in per_rank}) == 1  # same count: DeepSpeed boundaries line up
    owned = sorted(i for c in per_rank for idx, real in c if real for i in idx.tolist())
    assert owned == sorted(rows.tolist())
    for chunks in per_rank:
        for idx, real in chunks:
            cost = len(idx) * int(lengths[idx].max())
            assert cost <= budget or len(idx) == 1  # only a lone over-long row exceeds the budget
            if real and len(idx) > 1:
                assert lengths[idx].tolist() == sorted(lengths[idx].tolist())
    largest = max(math.ceil(len(rows) / world), 1)
    assert len(per_rank[0]) <= largest  # never more micro-batches than one row each


def torch_cfg(**kw) -> LearnerConfig:
    base = {"lr": 1e-3, "use_deepspeed": False, "kl_coef": 0.01, "micro_batch_rows": 4, "seed": 3, "eps": 1.0}
    return LearnerConfig(**{**base, **kw})


def test_budget_checkpointing_and_chunks_leave_the_update_unchanged(tiny_model_dir, make_rows):
    rows = make_rows()
    results = []
    variants = [
        {},  # today's path: fixed 4-row micro-batches
        {"max_tokens_per_micro_batch": 40, "gradient_checkpointing": True, "logprob_chunk_size": 3},
        {"max_tokens_per_micro_batch": 1, "logprob_chunk_size": 1},  # one row per micro-batch
    ]
    for extra in variants:
        w = LearnerWorker(torch_cfg(entropy_coeff=0.01, **extra), str(tiny_model_dir))
        m = w.train_step(rows)
        state = {k: v.detach().clone() for k, v in w.backend.module.named_parameters()}
        results.append((m, state, w.score(rows)))
    assert results[1][0].loss != 0
    assert LearnerWorker(torch_cfg(gradient_checkpointing=True), str(tiny_model_dir)).backend.module.is_gradient_checkpointing
    for m, state, scores in results[1:]:
        assert m.loss == pytest.approx(results[0][0].loss, abs=1e-5)
        assert m.entropy == pytest.approx(results[0][0].entropy, abs=1e-5)
        assert m.grad_norm == pytest.approx(results[0][0].grad_norm, rel=1e-4)
        for k, v in results[0][1].items():
            torch.testing.assert_close(state[k], v, atol=1e-6, rtol=0, msg=k)
        for a, b in zip(scores, results[0][2]):
            assert a == pytest.approx(b, abs=1e-5)


def test_entropy_skipped_when_nothing_needs_it(tiny_model_dir, make_rows, monkeypatch):
    import learner.logprobs as lp

    calls = []
    real = lp.entropy_of_logits
    monkeypatch.setattr(lp, "entropy_of_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    rows = make_rows()
    off = LearnerWorker(torch_cfg(log_entropy=False), str(tiny_model_dir)).train_step(rows)
    assert calls == [] and math.isnan(off.entropy)
    on = LearnerWorker(torch_cfg(), str(tiny_model_dir)).train_step(rows)
    assert calls and on.entropy > 0
    assert off.loss == pytest.approx(on.loss, abs=1e-6)


def test_bad_memory_settings_name_the_key():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        LearnerConfig(max_tokens_per_micro_batch=0)
    with pytest.raises(ValueError, match="logprob_chunk_size"):
        LearnerConfig(logprob_chunk_size=0)
    with pytest.raises(ValueError, match="ref_placement=shard"):
        LearnerConfig(ref_placement="shard", zero_stage=2)


def test_reference_on_cpu_gives_the_same_step(tiny_model_dir, make_rows):
    rows = make_rows()
    on_cpu = LearnerWorker(torch_cfg(ref_placement="cpu"), str(tiny_model_dir))
    assert next(on_cpu.ref_model.parameters()).device.type == "cpu"
    assert not any(p.requires_grad for p in on_cpu.ref_model.parameters())
    on_cpu.train_step(rows)
    m_cpu = on_cpu.train_step(rows)  # the second step has a policy != reference: KL > 0
    default = LearnerWorker(torch_cfg(), str(tiny_model_dir))
    default.train_step(rows)
    m_dev = default.train_step(rows)
    assert m_cpu.kl > 0 and m_cpu.kl == pytest.approx(m_dev.kl, abs=1e-7)
    assert m_cpu.loss == pytest.approx(m_dev.loss, abs=1e-6)
