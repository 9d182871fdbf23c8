"""GiGPO advantages as pure functions (docs/algorithms.md "GiGPO"; Feng et al. 2025, "Group-in-Group
Policy Optimization for LLM Agent Training", the algorithm of verl-agent).

Two levels of relative advantage, both critic-free:
- episode level: the GRPO advantage of each trajectory's return within its task group
  (`learner.algos.grpo_advantages`, the same code the grpo estimator runs);
- step level: within one task group, the turns taken from an IDENTICAL environment state (the same
  anchor key) form an anchor-state group; each turn's discounted return R_t = sum_k gamma^k r_{t+k}
  is compared with the mean of its anchor group (and divided by the group's std in "mean_std_norm").

A = A_episode + omega * A_step. A turn alone in its anchor group gets A_step = 0 (it has nothing to
be compared with), so with no repeated states GiGPO reduces to the episode term.

Rows are identified by integer ids only (any ints: only equality matters), as in learner/algos.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from learner.algos import grpo_advantages

GIGPO_MODES = ("mean_norm", "mean_std_norm")
"""verl-agent's normalisations: subtract the group mean only, or also divide by the group std."""


def anchor_key(observation: str) -> str:
    """The anchor-state key of a turn: a digest of the exact environment observation it acted on
    (`rollout_workers.types.Turn.observation`, the env's text before the action)."""
    return hashlib.sha256(observation.encode("utf-8")).hexdigest()[:32]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = r_t + gamma * R_{t+1} (R_T = 0) for the rewards of one trajectory, in turn order."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def step_advantages(
    step_returns: torch.Tensor, anchor_ids: torch.Tensor, *, norm_by_std: bool, eps: float = 1e-6
) -> torch.Tensor:
    """A_step per row: (R_t - mean_a) [/ (std_a + eps)], a = the row's anchor group.

    step_returns (B,) float; anchor_ids (B,) int, equal for rows of the same task group that acted on
    the same state (callers build them from (group, anchor key)). std is the unbiased std of the
    group; a group of one row gets 0. Statistics in float64, and a group whose returns are all equal
    is centred on that exact value, so it gets exactly 0 (as `grpo_advantages`). Returns (B,) float32.
    """
    if step_returns.numel() == 0:
        raise ValueError("step_advantages needs at least one row")
    if step_returns.shape != anchor_ids.shape:
        raise ValueError(f"step_returns {tuple(step_returns.shape)} and anchor_ids {tuple(anchor_ids.shape)} differ")
    x = step_returns.double()
    dev = x.device
    group = torch.unique(anchor_ids.to(dev), return_inverse=True)[1]
    n = int(group.max()) + 1
    count = torch.zeros(n, dtype=x.dtype, device=dev).index_add_(0, group, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, group, x) / count
    big = torch.finfo(x.dtype).max
    lo = torch.full_like(count, big).scatter_reduce(0, group, x, reduce="amin")
    hi = torch.full_like(count, -big).scatter_reduce(0, group, x, reduce="amax")
    mean = torch.where(lo == hi, lo, mean)
    centered = x - mean[group]
    if norm_by_std:
        var = torch.zeros_like(count).index_add_(0, group, centered**2) / (count - 1.0).clamp_min(1.0)
        centered = centered / (var.sqrt()[group] + eps)
    return torch.where(count[group] <= 1, torch.zeros_like(centered), centered).float()


def gigpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    traj_ids: torch.Tensor,
    step_returns: torch.Tensor,
    anchor_ids: torch.Tensor,
    *,
    omega: float,
    mode: str = "mean_norm",
    cross_step: bool = True,
    singleton_zero: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_i = A_episode_i + omega * A_step_i, all (B,) -> (B,) float32.

    scores: the episode-level score of each row (the trajectory return, less the invalid-action
    penalty: `learner.actor.row_scores`); group/traj ids as in `grpo_advantages` (whose
    `cross_step` and `singleton_zero` apply to the episode term); step_returns and anchor_ids as in
    `step_advantages`. `mode` ("mean_norm" | "mean_std_norm") sets the normalisation of BOTH terms,
    as verl-agent's `algorithm.gigpo.mode` does.
    """
    if mode not in GIGPO_MODES:
        raise ValueError(f"unknown GiGPO mode {mode!r}; known: {', '.join(GIGPO_MODES)}")
    by_std = mode == "mean_std_norm"
    episode = grpo_advantages(
        scores, group_ids, traj_ids, cross_step=cross_step, norm_by_std=by_std, eps=eps, singleton_zero=singleton_zero
    )
    return episode + omega * step_advantages(step_returns, anchor_ids, norm_by_std=by_std, eps=eps)
