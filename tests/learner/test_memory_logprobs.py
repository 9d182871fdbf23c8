"""Chunked log-probs and entropy (learner/logprobs.py): equal to 1e-5 (values and gradients) to the
full-vocabulary reference (`response_logits` + `logprobs_from_logits` / `entropy_of_logits`), with
temperature, allowed-token renormalisation and padding, for any chunk size."""

from __future__ import annotations

import pytest
import torch

from learner.batch import collate_rows
from learner.logprobs import (
    chunked_logprobs,
    entropy_of_logits,
    logprobs_from_logits,
    response_logits,
    response_logprobs,
)
from learner.types import TrainRow


def _row(prompt, response, allowed=None):
    return TrainRow(
        prompt_ids=tuple(prompt), response_ids=tuple(response), sampler_logprobs=(-0.5,) * len(response),
        allowed_token_ids=allowed, group_id="g", traj_id="t", step_idx=0, episode_score=1.0, action_valid=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_chunked_logprobs_equal_full_softmax_with_gradients(chunk_size):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 16, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (7,), generator=gen)
    logp, ent = chunked_logprobs(hidden, weight, targets, temperature=0.7, chunk_size=chunk_size, with_entropy=True)
    assert ent is not None and logp.dtype == torch.float32 and logp.shape == (7,)
    g_chunk = torch.autograd.grad((logp * 1.3 + ent * 0.4).sum(), (hidden, weight))
    logits = (hidden @ weight.T).float() / 0.7
    ref_logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    p = torch.softmax(logits, -1)
    ref_ent = -(p * torch.log_softmax(logits, -1)).sum(-1)
    g_ref = torch.autograd.grad((ref_logp * 1.3 + ref_ent * 0.4).sum(), (hidden, weight))
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    for a, b in zip(g_chunk, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    no_ent = chunked_logprobs(hidden, weight, targets, temperature=0.7, chunk_size=chunk_size)
    assert no_ent[1] is None
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(hidden, weight, targets, chunk_size=0)


def test_chunked_logprobs_accepts_bf16_hidden():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 8, generator=gen).bfloat16()
    weight = torch.randn(30, 8, generator=gen).bfloat16()
    targets = torch.randint(0, 30, (5,), generator=gen)
    logp, _ = chunked_logprobs(hidden, weight, targets, chunk_size=2)
    ref = torch.log_softmax((hidden @ weight.T).float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [2, 1024])
def test_model_scores_match_full_vocabulary_reference(model, chunk_size):
    rows = [
        _row([11, 12, 13], [21, 22, 23, 24], allowed=((21, 30, 31), (22,), (23, 5, 6), (24, 40))),
        _row([14], [25, 26]),
        _row([15, 16, 17, 18, 19], [27, 28, 29], allowed=((27, 41), (28,), (29, 3))),
    ]
    batch = collate_rows(rows, pad_token_id=0)
    mask = batch.response_mask
    model.zero_grad()
    got = response_logprobs(model, batch, temperature=0.7, with_entropy=True, chunk_size=chunk_size)
    assert got.entropy is not None
    (got.logp.sum() * 0.9 + got.entropy.sum() * 0.3).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits = response_logits(model, batch, temperature=0.7)
    ref_logp = logprobs_from_logits(logits, batch.responses, batch.allowed_ids) * mask
    ref_ent = entropy_of_logits(logits, batch.allowed_ids) * mask
    (ref_logp.sum() * 0.9 + ref_ent.sum() * 0.3).backward()
    torch.testing.assert_close(got.logp.detach(), ref_logp.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy.detach(), ref_ent.detach(), atol=1e-5, rtol=0)
    assert got.logp[1, 2:].abs().sum() == 0 and got.entropy[1, 2:].abs().sum() == 0  # padding stays 0
    assert got.logp[0, 1].item() == pytest.approx(0.0, abs=1e-6)  # forced token under the constraint
    assert ours.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, grad in ours.items():
        torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, atol=1e-5, rtol=1e-4)
    model.zero_grad()
