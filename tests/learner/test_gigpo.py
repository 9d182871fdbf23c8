"""GiGPO math (docs/algorithms.md "GiGPO") with hand-computed values: discounted step returns, the
step-level advantage within anchor-state groups, A = A_episode + omega * A_step in both of
verl-agent's modes, anchor groups scoped to one task group, and the rows/batch fields that carry
the anchor key and step return to the learner. Pure torch, no model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from learner.actor import row_advantages
from learner.batch import collate_rows, rows_from_trajectories, select_rows
from learner.config import LearnerConfig
from learner.gigpo import anchor_key, discounted_returns, gigpo_advantages, step_advantages

T = torch.tensor


def _turn(observation, reward, response=(5,)):
    return SimpleNamespace(prompt_ids=[1, 2], response_ids=list(response), sampler_logprobs=[-0.1] * len(response),
                           allowed_token_ids=None, action_valid=True, observation=observation, reward=reward)


def _two_episodes(group="g", second_group=None):
    """One task group: A wins (s0 -> s1 -> s2, reward 10 on the last step), B fails (s0 -> s1 -> s3).
    s0 and s1 are shared anchor states; s2 and s3 are singletons."""
    return [
        SimpleNamespace(group_id=group, traj_id="A", score=10.0,
                        turns=[_turn("s0", 0.0), _turn("s1", 0.0), _turn("s2", 10.0)]),
        SimpleNamespace(group_id=second_group or group, traj_id="B", score=0.0,
                        turns=[_turn("s0", 0.0), _turn("s1", 0.0), _turn("s3", 0.0)]),
    ]


# --- discounted returns ------------------------------------------------------------------------


def test_discounted_returns_by_hand():
    assert discounted_returns([0.0, 0.0, 10.0], 0.5) == [2.5, 5.0, 10.0]
    assert discounted_returns([1.0, 2.0, 3.0], 1.0) == [6.0, 5.0, 3.0]
    assert discounted_returns([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]
    assert discounted_returns([], 0.9) == []
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], 1.5)


# --- step-level advantage ----------------------------------------------------------------------


def test_step_advantage_mean_norm_by_hand():
    # anchors: {0: 2.5, 0}, {1: 5, 0}, {2: 10}, {3: 0}
    got = step_advantages(T([2.5, 5.0, 10.0, 0.0, 0.0, 0.0]), T([0, 1, 2, 0, 1, 3]), norm_by_std=False)
    torch.testing.assert_close(got, T([1.25, 2.5, 0.0, -1.25, -2.5, 0.0]), atol=1e-6, rtol=0)


def test_step_advantage_mean_std_norm_by_hand():
    # pairs {x, 0}: unbiased std = x / sqrt(2), so A = +-(x / 2) / (x / sqrt(2)) = +-1/sqrt(2)
    got = step_advantages(T([2.5, 5.0, 10.0, 0.0, 0.0, 0.0]), T([0, 1, 2, 0, 1, 3]), norm_by_std=True)
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(got, T([r, r, 0.0, -r, -r, 0.0]), atol=1e-5, rtol=0)


def test_step_advantage_three_member_group_and_equal_returns():
    # {3, 6, 9}: mean 6, unbiased std 3 -> [-1, 0, 1]; {0.1, 0.1, 0.1}: exactly 0
    got = step_advantages(T([3.0, 6.0, 9.0, 0.1, 0.1, 0.1]), T([7, 7, 7, 4, 4, 4]), norm_by_std=True)
    torch.testing.assert_close(got[:3], T([-1.0, 0.0, 1.0]), atol=1e-5, rtol=0)
    assert torch.equal(got[3:], torch.zeros(3))
    with pytest.raises(ValueError, match="differ"):
        step_advantages(T([1.0, 2.0]), T([0]), norm_by_std=False)


# --- combined ------------------------------------------------------------------------------------


def _combined(mode, omega):
    # rows in order A0 A1 A2 B0 B1 B2; episode scores 10 x 3, 0 x 3; step returns with gamma 0.5
    return gigpo_advantages(
        T([10.0, 10.0, 10.0, 0.0, 0.0, 0.0]), T([0] * 6), T([0, 0, 0, 1, 1, 1]),
        T([2.5, 5.0, 10.0, 0.0, 0.0, 0.0]), T([0, 1, 2, 0, 1, 3]), omega=omega, mode=mode,
    )


def test_gigpo_mean_norm_by_hand():
    # episode: mean 5 -> +-5; step: +-1.25, +-2.5, 0; omega 0.5
    got = _combined("mean_norm", 0.5)
    torch.testing.assert_close(got, T([5.625, 6.25, 5.0, -5.625, -6.25, -5.0]), atol=1e-5, rtol=0)


def test_gigpo_mean_std_norm_by_hand():
    # episode over 6 rows [10,10,10,0,0,0]: mean 5, unbiased var 6 * 25 / 5 = 30 -> +-5/sqrt(30);
    # step: +-1/sqrt(2) on the shared states, 0 on the singletons; omega 1
    e, s = 5 / math.sqrt(30), 1 / math.sqrt(2)
    got = _combined("mean_std_norm", 1.0)
    torch.testing.assert_close(got, T([e + s, e + s, e, -e - s, -e - s, -e]), atol=1e-5, rtol=0)


def test_gigpo_without_repeated_states_is_the_episode_advantage():
    got = gigpo_advantages(T([1.0, 0.0, 0.0, 0.0]), T([0] * 4), T([0, 1, 2, 3]), T([9.0, 1.0, 2.0, 3.0]),
                           T([0, 1, 2, 3]), omega=1.0, mode="mean_std_norm")
    torch.testing.assert_close(got, T([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)  # GRPO's S7.2 case
    with pytest.raises(ValueError, match="mode"):
        gigpo_advantages(T([1.0]), T([0]), T([0]), T([1.0]), T([0]), omega=1.0, mode="std")


def test_gigpo_mean_std_norm_per_trajectory_penalty_stays_bounded():
    """Two failed episodes on the same two states, episode 0's second action invalid (c_inv 0.1):
    scores (0, -0.1 | 0, 0), step returns all 0 so A_step = 0. The episode term weighs each row 1/2:
    mu = -0.025, sigma^2 = 1/2 (0.025^2 + 0.075^2 + 0.025^2 + 0.025^2) / (2 - 1) = 0.00375."""
    scores = T([0.0, -0.1, 0.0, 0.0])
    got = gigpo_advantages(scores, T([0] * 4), T([0, 0, 1, 1]), torch.zeros(4), T([0, 1, 0, 1]),
                           omega=1.0, mode="mean_std_norm", cross_step=False)  # fmt: skip
    expected = T([0.025, -0.075, 0.025, 0.025]) / (math.sqrt(0.00375) + 1e-6)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)  # first rows tie: was -1e5


# --- rows, batch and the learner's estimator switch -----------------------------------------------


def test_rows_carry_anchor_key_and_discounted_return():
    rows = rows_from_trajectories(_two_episodes(), gamma=0.5)
    assert [r.step_return for r in rows] == [2.5, 5.0, 10.0, 0.0, 0.0, 0.0]
    assert [r.anchor_key for r in rows] == [anchor_key(o) for o in ("s0", "s1", "s2", "s0", "s1", "s3")]
    assert anchor_key("s0") != anchor_key("s0 ") and len(anchor_key("s0")) == 32
    batch = collate_rows(rows, pad_token_id=0)
    assert batch.anchor_index.tolist() == [0, 1, 2, 0, 1, 3]
    assert batch.step_returns.tolist() == [2.5, 5.0, 10.0, 0.0, 0.0, 0.0]
    sub = select_rows(batch, T([4, 0]))
    assert sub.anchor_index.tolist() == [1, 0] and sub.step_returns.tolist() == [0.0, 2.5]


def test_anchor_groups_never_cross_task_groups():
    """The same observation in two different task groups is two anchor groups (verl-agent groups
    steps within each episode group)."""
    batch = collate_rows(rows_from_trajectories(_two_episodes("g1", "g2"), gamma=0.5), pad_token_id=0)
    assert len(set(batch.anchor_index.tolist())) == 6


def test_learner_switches_estimator():
    rows = rows_from_trajectories(_two_episodes(), gamma=0.5)
    batch = collate_rows(rows, pad_token_id=0)
    common = {"invalid_action_penalty": 0.0, "norm_adv_by_std": False}
    gigpo = row_advantages(LearnerConfig(adv_estimator="gigpo", gigpo_omega=0.5, **common), batch)
    torch.testing.assert_close(gigpo, T([5.625, 6.25, 5.0, -5.625, -6.25, -5.0]), atol=1e-5, rtol=0)
    grpo = row_advantages(LearnerConfig(**common), batch)
    torch.testing.assert_close(grpo, T([5.0, 5.0, 5.0, -5.0, -5.0, -5.0]), atol=1e-5, rtol=0)
    # a row built by hand has no anchor key: its own anchor group, so its step term is 0
    hand = [r.model_copy(update={"anchor_key": ""}) for r in rows]
    alone = row_advantages(LearnerConfig(adv_estimator="gigpo", **common), collate_rows(hand, pad_token_id=0))
    torch.testing.assert_close(alone, grpo, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="gigpo_gamma"):
        LearnerConfig(gigpo_gamma=1.2)
