"""GRPO math: docs/algorithms.md S7 "GRPO" cases 1-10 with hand-computed values, plus KL, aggregation
modes and diagnostics. Pure torch, no model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.algos import (
    AGG_MODES,
    agg_denominator,
    agg_loss,
    broadcast_advantages,
    cap_invalid_advantages,
    entropy_from_logits,
    grpo_advantages,
    kl_penalty,
    penalised_scores,
    ppo_policy_loss,
)

T = torch.tensor
CLIP = {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0}


def adv(scores, groups=None, trajs=None, **kw):
    n = len(scores)
    groups = T([0] * n) if groups is None else T(groups)
    trajs = T(list(range(n))) if trajs is None else T(trajs)
    return grpo_advantages(T(scores, dtype=torch.float32), groups, trajs, **kw)


# --- S7.1-3: advantages -----------------------------------------------------------------------


def test_identical_rewards_give_zero_advantage():  # S7.1
    assert torch.equal(adv([3.0, 3.0, 3.0, 3.0]), torch.zeros(4))


@pytest.mark.parametrize("value", [0.1, -0.1, 123.456, 1e-7, -3.3, 0.3, 1e6 + 0.1])
@pytest.mark.parametrize("size", [2, 3, 7, 16, 64, 257])
@pytest.mark.parametrize("cross_step", [True, False])
def test_all_equal_group_gets_exactly_zero_advantage(value, size, cross_step):
    """float32 statistics gave 16 x 0.1 -> 0.015 and 16 x 123.456 -> 0.93 (inexact mean over a
    ~1e-6 std); the group statistics are float64 and a zero spread centres exactly."""
    trajs = list(range(size))
    got = adv([value] * size, groups=[0] * size, trajs=trajs, cross_step=cross_step)
    assert torch.equal(got, torch.zeros(size)), got
    # next to a group with spread, in the same batch
    mixed = adv([value] * size + [1.0, 0.0], groups=[0] * size + [1, 1], trajs=trajs + [size, size + 1])
    assert torch.equal(mixed[:size], torch.zeros(size))
    torch.testing.assert_close(mixed[size:], T([1.0, -1.0]) / math.sqrt(2), atol=1e-5, rtol=0)


def test_one_success_of_four_uses_unbiased_std():  # S7.2: std([1,0,0,0], unbiased) = 0.5
    torch.testing.assert_close(adv([1.0, 0, 0, 0]), T([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)


def test_cross_step_counts_every_row():  # S7.3: 3-step success + 1-step failure
    got = adv([1.0, 1, 1, 0], trajs=[0, 0, 0, 1], cross_step=True)
    torch.testing.assert_close(got, T([0.5, 0.5, 0.5, -1.5]), atol=1e-5, rtol=0)


def test_per_trajectory_counts_each_trajectory_once():  # S7.3: [1, 0] -> +-1/sqrt(2)
    got = adv([1.0, 1, 1, 0], trajs=[0, 0, 0, 1], cross_step=False)
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(got, T([r, r, r, -r]), atol=1e-5, rtol=0)


def test_per_trajectory_weighs_each_row_one_over_its_trajectory_length():
    """Rows [1, 0] of trajectory 0 weigh 1/2 each, row [0] of trajectory 1 weighs 1: mu = 1/4,
    sigma^2 = (1/2 (3/4)^2 + 1/2 (1/4)^2 + (1/4)^2) / (2 - 1) = 3/8, so A = (3, -1, -1) / sqrt(6)."""
    got = adv([1.0, 0.0, 0.0], trajs=[0, 0, 1], cross_step=False)
    torch.testing.assert_close(got, T([3.0, -1.0, -1.0]) / math.sqrt(6), atol=1e-5, rtol=0)


def test_per_trajectory_penalty_after_tied_first_rows_stays_bounded():
    """Two failed episodes (R = 0); episode 0's second action is invalid (c_inv = 0.1). The first
    rows tie, so statistics from first rows alone had sigma = 0 and gave the penalised row
    -0.1 / 1e-6 = -1e5. Weighted statistics: mu = -0.025, sigma^2 = (1/2 0.025^2 + 1/2 0.075^2 +
    0.025^2) / 1 = 0.00375, A = (0.025, -0.075, 0.025) / (sqrt(0.00375) + 1e-6), about
    (1, -3, 1) / sqrt(6)."""
    scores = penalised_scores(T([0.0, 0.0, 0.0]), T([True, False, True]), invalid_action_penalty=0.1)
    got = grpo_advantages(scores, T([0, 0, 0]), T([0, 0, 1]), cross_step=False)
    torch.testing.assert_close(got, T([0.025, -0.075, 0.025]) / (math.sqrt(0.00375) + 1e-6), atol=1e-6, rtol=0)
    assert got.abs().max() < 1.3
    dr_grpo = grpo_advantages(scores, T([0, 0, 0]), T([0, 0, 1]), cross_step=False, norm_by_std=False)
    torch.testing.assert_close(dr_grpo, T([0.025, -0.075, 0.025]), atol=1e-7, rtol=0)


def test_per_trajectory_singleton_is_one_trajectory_of_many_rows():
    got = adv([1.0, 0.9, 0.0], trajs=[0, 0, 0], cross_step=False)
    assert torch.equal(got, torch.zeros(3))
    assert adv([1.0, 0.9], trajs=[0, 0], cross_step=False, singleton_zero=False).tolist() == [1.0, 0.8999999761581421]


def test_groups_are_independent():
    got = adv([1.0, 0, 5, 5, 7], groups=[0, 0, 1, 1, 2])
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(got, T([r, -r, 0, 0, 0]), atol=1e-5, rtol=0)


def test_singleton_group_zero_or_raw_score():
    assert adv([4.0, 1, 2], groups=[0, 1, 1])[0] == 0.0
    assert adv([4.0, 1, 2], groups=[0, 1, 1], singleton_zero=False)[0] == 4.0


def test_dr_grpo_subtracts_mean_only():
    torch.testing.assert_close(adv([1.0, 0, 0, 0], norm_by_std=False), T([0.75, -0.25, -0.25, -0.25]))


def test_invalid_action_penalty_and_cap():
    scores = penalised_scores(T([10.0, 10.0, 0.0]), T([True, False, True]), invalid_action_penalty=0.1)
    torch.testing.assert_close(scores, T([10.0, 9.9, 0.0]))
    capped = cap_invalid_advantages(T([1.0, 1.0, -1.0]), T([True, False, False]))
    assert capped.tolist() == [1.0, 0.0, -1.0]


# --- S7.4: broadcast --------------------------------------------------------------------------


def test_broadcast_fills_response_tokens_only():  # S7.4
    mask = T([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    got = broadcast_advantages(T([0.5, -2.0]), mask)
    assert got.tolist() == [[0.5, 0.5, 0.5, 0.0], [-2.0, 0.0, 0.0, 0.0]]


# --- S7.5-7, 10: policy loss ------------------------------------------------------------------


def test_on_policy_loss_is_minus_token_mean_advantage_and_gradient():  # S7.5
    mask = T([[1.0, 1, 1], [1, 1, 0]])
    a = broadcast_advantages(T([1.5, -0.5]), mask)
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    pl = ppo_policy_loss(logp, logp.detach(), a, mask, **CLIP)
    loss = agg_loss(pl.loss, mask, "token-mean")
    n_tok = 5.0
    assert loss.item() == pytest.approx(-(3 * 1.5 - 2 * 0.5) / n_tok)
    loss.backward()
    torch.testing.assert_close(logp.grad, -a / n_tok)


@pytest.mark.parametrize("a", [1.0, -1.0])
@pytest.mark.parametrize("ratio", [0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 2.0])
def test_clip_activates_only_outside_trust_region(a, ratio):  # S7.6
    mask = torch.ones(1, 1)
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    pl = ppo_policy_loss(logp, torch.zeros(1, 1), torch.full((1, 1), a), mask, **CLIP)
    expected = (a > 0 and ratio > 1.2) or (a < 0 and ratio < 0.8)
    assert bool(pl.clipped.item()) == expected
    pl.loss.sum().backward()
    assert (logp.grad.abs().item() == 0.0) == expected  # clipped tokens get no gradient


def test_dual_clip_caps_negative_advantage_loss():  # S7.7
    mask = torch.ones(1, 1)
    pl = ppo_policy_loss(
        torch.full((1, 1), math.log(10.0)), torch.zeros(1, 1), torch.full((1, 1), -2.0), mask, **CLIP
    )
    assert pl.loss.item() == pytest.approx(-3.0 * -2.0)
    assert pl.clipped_lower.item() == 1.0
    assert pl.clipped.item() == 0.0


def test_ppo_kl_metric_is_old_minus_new():
    mask = T([[1.0, 0.0]])
    pl = ppo_policy_loss(T([[-1.0, -9.0]]), T([[-1.5, 0.0]]), torch.zeros(1, 2), mask, **CLIP)
    assert pl.approx_kl.tolist() == [[-0.5, 0.0]]


def test_raising_logp_of_positive_advantage_lowers_loss():  # S7.10
    mask = torch.ones(1, 2)
    a = T([[1.0, 1.0]])
    old = T([[-2.0, -2.0]])

    def loss(lp):
        return agg_loss(ppo_policy_loss(lp, old, a, mask, **CLIP).loss, mask, "token-mean").item()

    assert loss(old + 0.1) < loss(old)
    assert loss(old - 0.1) > loss(old)
    neg = T([[-1.0, -1.0]])
    assert agg_loss(ppo_policy_loss(old + 0.1, old, neg, mask, **CLIP).loss, mask, "token-mean") > agg_loss(
        ppo_policy_loss(old, old, neg, mask, **CLIP).loss, mask, "token-mean"
    )


# --- S7.8: KL --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "k3+", "abs"])
def test_kl_is_zero_at_reference(kind):  # S7.8 (k3, and all estimators' values)
    logp = T([[-1.0, -2.0]], requires_grad=True)
    value = kl_penalty(logp, logp.detach().clone(), kind)
    assert torch.equal(value.detach(), torch.zeros(1, 2))
    if kind in ("k2", "k3", "k3+"):
        value.sum().backward()
        assert torch.equal(logp.grad, torch.zeros(1, 2))


def test_kl_estimator_values():
    logp, ref = T([-1.0]), T([-1.5])  # logp - ref = 0.5
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    # x = clamp(-30, +-20) = -20 -> e^-20 + 19 = 19, then the value clamp to 10
    assert kl_penalty(T([0.0]), T([-30.0]), "k3").item() == 10.0


def test_k3_plus_has_k3_value_and_k2_gradient():
    logp = T([-1.0, -3.0], requires_grad=True)
    ref = T([-1.5, -2.0])
    value = kl_penalty(logp, ref, "k3+")
    torch.testing.assert_close(value.detach(), kl_penalty(logp.detach(), ref, "k3"))
    value.sum().backward()
    torch.testing.assert_close(logp.grad, (logp - ref).detach())  # d/dlogp of (logp-ref)^2/2


def test_unknown_kl_raises():
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(T([0.0]), T([0.0]), "k9")


# --- aggregation, S7.9 ------------------------------------------------------------------------

VALUES = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 3)),
    ],
)
def test_agg_modes_hand_values(mode, expected):
    assert agg_loss(VALUES, MASK, mode).item() == pytest.approx(expected)


def test_row_weights_scale_rows():
    w = T([0.5, 1.0])
    assert agg_loss(VALUES, MASK, "token-mean", row_weights=w).item() == pytest.approx((3 + 4) / (1.5 + 1))
    assert agg_loss(VALUES, MASK, "seq-mean-token-mean", row_weights=w).item() == pytest.approx((1 + 4) / 1.5)


def test_global_denominator_counts_whole_minibatch():  # S7.9, SD.9
    den = agg_denominator(MASK, "token-mean")
    assert den == 4.0
    parts = agg_loss(VALUES[:1], MASK[:1], "token-mean", global_denominator=den) + agg_loss(
        VALUES[1:], MASK[1:], "token-mean", global_denominator=den
    )
    assert parts.item() == pytest.approx(2.5)
    # a local (per-micro-batch) mean would give (2 + 4) / 2 = 3 instead
    assert (
        agg_loss(VALUES[:1], MASK[:1], "token-mean") + agg_loss(VALUES[1:], MASK[1:], "token-mean")
    ) / 2 == 3


@st.composite
def split_batches(draw):
    b = draw(st.integers(1, 8))
    length = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(b, length, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, length, generator=gen) < 0.7).double()
    mask[0, 0] = 1.0
    weights = torch.rand(b, generator=gen, dtype=torch.float64) + 0.1
    perm = torch.randperm(b, generator=gen)  # rows dealt to "ranks" in any order
    cuts = sorted(draw(st.lists(st.integers(1, max(b - 1, 1)), max_size=4, unique=True))) if b > 1 else []
    return values, mask, weights, perm, cuts


@settings(max_examples=60, deadline=None)
@given(split_batches(), st.sampled_from(sorted(AGG_MODES)))
def test_loss_invariant_to_micro_batch_and_rank_split(data, mode):  # S7.9 property
    values, mask, weights, perm, cuts = data
    full = agg_loss(values, mask, mode, row_weights=weights, norm_length=values.shape[1])
    den = agg_denominator(mask, mode, row_weights=weights, norm_length=values.shape[1])
    total = torch.zeros((), dtype=torch.float64)
    for idx in torch.tensor_split(perm, cuts):
        total += agg_loss(
            values[idx],
            mask[idx],
            mode,
            global_denominator=den,
            row_weights=weights[idx],
            norm_length=values.shape[1],
        )
    torch.testing.assert_close(total, full)


# --- diagnostics ------------------------------------------------------------------------------


def test_entropy_of_uniform_and_masked_logits():
    assert entropy_from_logits(torch.zeros(7)).item() == pytest.approx(math.log(7))
    masked = T([0.0, 0.0, float("-inf"), float("-inf")])
    assert entropy_from_logits(masked).item() == pytest.approx(math.log(2))
