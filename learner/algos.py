"""GRPO math as pure torch functions (docs/algorithms.md S1, after verl core_algos and verl-agent).

Conventions: B rows (one row = one environment turn), L response positions; `mask` is the (B, L)
response mask (1 on generated tokens incl. EOS, 0 on padding; the prompt is never in it).
Every function takes tensors and keyword scalars only: no config objects, no module state.

Departures from verl, on purpose:
- a group with a single member gets advantage 0 by default (verl: its raw score), S1;
- every aggregation mode is a ratio of two sums (numerator over the given rows, denominator over
  the whole mini-batch on all ranks), so any split into micro-batches / ranks gives the same loss;
- seq-mean-token-sum-norm divides by (norm_length x sequences) like Dr.GRPO, not by L_r alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LOG_RATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0


# ---------------------------------------------------------------------------------------------
# scores and advantages


def penalised_scores(
    episode_scores: torch.Tensor, action_valid: torch.Tensor, *, invalid_action_penalty: float
) -> torch.Tensor:
    """s_i = R(tau_i) - c_inv * [row i's action invalid]. (B,), (B,) bool -> (B,) float32."""
    return episode_scores.float() - invalid_action_penalty * (~action_valid.bool()).float()


def _dense_ids(ids: torch.Tensor) -> torch.Tensor:
    return torch.unique(ids, return_inverse=True)[1]


def _group_sum(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """(B,) float64 values summed per dense group id: (B,), (B,) -> (G,)."""
    sums = torch.zeros(int(group.max()) + 1, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group, values)


def _member_weights(
    group: torch.Tensor, traj_ids: torch.Tensor, cross_step: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's weight in its group's statistics (B,) and each group's member count (G,), float64.
    cross_step=True: weight 1 per row, members = rows; False: weight 1 / T per row of a T-row
    trajectory (each trajectory weighs 1 in total), members = trajectories."""
    num_groups = int(group.max()) + 1
    if cross_step:
        ones = torch.ones(group.numel(), dtype=torch.float64, device=group.device)
        return ones, _group_sum(ones, group)
    pair_ids = torch.stack([group, traj_ids.to(group.device).long()], 1)
    pairs, pair = torch.unique(pair_ids, dim=0, return_inverse=True)
    rows_per_traj = torch.bincount(pair).double()
    trajs = torch.bincount(pairs[:, 0], minlength=num_groups).double()
    return 1.0 / rows_per_traj[pair], trajs


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    traj_ids: torch.Tensor,
    *,
    cross_step: bool = True,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    singleton_zero: bool = True,
) -> torch.Tensor:
    """Outcome-GRPO advantage per row: A_i = (s_i - mu_g) / (sigma_g + eps), g = group of row i.

    scores (B,) float; group_ids (B,) int; traj_ids (B,) int, unique per trajectory (any ints:
    only equality matters). Returns (B,) float32.

    mu_g and sigma_g are the weighted mean and unbiased std of the row scores s_i of group g, the
    same quantity that is normalised. cross_step=True (verl-agent default): every row weighs 1, so
    a T-step trajectory counts T times. cross_step=False: each row of a T-row trajectory weighs 1/T,
    so each trajectory counts once (sigma^2 = sum w (s - mu)^2 / (trajectories - 1)); when all rows
    of a trajectory share a score this is verl-agent's per-trajectory statistic exactly, and a row
    whose own score differs (the invalid-action penalty) is measured against a spread it is part of.
    A group with one member (row, or trajectory when cross_step=False) gets A = 0 when
    singleton_zero, else its raw score (verl: mu = 0, sigma = 1). norm_by_std=False is Dr.GRPO.
    """
    if scores.numel() == 0:
        raise ValueError("grpo_advantages needs at least one row")
    scores, dev = scores.float(), scores.device
    group = _dense_ids(group_ids.to(dev))
    weight, members = _member_weights(group, traj_ids, cross_step)
    # Group statistics in float64, and a group whose rows all scored the same is centred on that
    # exact value: float32 sums leave a ~1e-6 residue that the std (also ~1e-6) would blow back
    # up to O(1) (16 x 0.1 -> A = 0.015 in float32).
    x = scores.double()
    mean = _group_sum(weight * x, group) / _group_sum(weight, group)
    lo = torch.zeros_like(members).scatter_reduce(0, group, x, reduce="amin", include_self=False)
    hi = torch.zeros_like(members).scatter_reduce(0, group, x, reduce="amax", include_self=False)
    mean = torch.where(lo == hi, lo, mean)
    centered = x - mean[group]
    var = _group_sum(weight * centered**2, group) / (members - 1.0).clamp_min(1.0)
    adv = (centered / (var.sqrt()[group] + eps) if norm_by_std else centered).float()
    raw = torch.zeros_like(scores) if singleton_zero else scores
    return torch.where(members[group] <= 1, raw, adv)


def cap_invalid_advantages(advantages: torch.Tensor, action_valid: torch.Tensor) -> torch.Tensor:
    """UniSkill's option: A_i <- min(A_i, 0) where row i's action was invalid. (B,) -> (B,)."""
    return torch.where(action_valid.bool(), advantages, advantages.clamp(max=0.0))


def broadcast_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_hat[i, t] = A_i * mask[i, t]: (B,), (B, L) -> (B, L); padding carries 0."""
    return advantages[:, None] * mask


# ---------------------------------------------------------------------------------------------
# policy loss


@dataclass(frozen=True)
class PolicyLoss:
    """Per-token PPO terms, all (B, L) and zero outside the mask."""

    loss: torch.Tensor  # per-token clipped (and dual-clipped) surrogate loss
    clipped: torch.Tensor  # 1 where the epsilon clip bound is active (verl pg_clipfrac)
    clipped_lower: torch.Tensor  # 1 where the dual clip -c*A is active (verl pg_clipfrac_lower)
    approx_kl: torch.Tensor  # old_logp - logp (verl ppo_kl), detached

    def clipfrac(self, mask: torch.Tensor) -> float:
        return float(self.clipped.sum() / mask.sum().clamp_min(1.0))


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float,
) -> PolicyLoss:
    """Clipped surrogate with dual clip (verl compute_policy_loss_vanilla).

    logp (B, L) with grad; old_logp (B, L) detached; advantages (B, L) (already broadcast);
    mask (B, L). rho = exp(clamp(logp - old_logp, +-20)); L_clip = max(-A rho, -A clip(rho,
    1-clip_low, 1+clip_high)); for A < 0 the loss is min(L_clip, -A c).
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1, got {clip_c}")
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(loss_clip, loss_dual), loss_clip)
    clipped = (loss_clipped > loss_unclipped).float() * mask
    clipped_lower = ((loss_clip > loss_dual) & negative).float() * mask
    return PolicyLoss(
        loss=loss * mask,
        clipped=clipped,
        clipped_lower=clipped_lower,
        approx_kl=(-log_ratio).detach() * mask,
    )


# ---------------------------------------------------------------------------------------------
# off-policy correction (docs/algorithms.md "Off-policy correction")

OFF_POLICY_METHODS = ("none", "decoupled", "tis", "seq_mask_tis", "icepop")
MASKED_METHODS = ("seq_mask_tis", "icepop")
"""The methods that keep only tokens inside a (low, high) band: of each row's geometric-mean
weight (seq_mask_tis) or of each token's weight (icepop)."""


@dataclass(frozen=True)
class BehaviourWeights:
    """Per-token behaviour importance weights w = pi_prox / pi_behav, all (B, L), detached, 0
    outside the mask."""

    weight: torch.Tensor  # the weight the loss applies (after the cap / the masks)
    raw: torch.Tensor  # exp(clamp(prox_logp - behav_logp, +-20)) before the cap
    capped: torch.Tensor  # 1 where the cap or a mask changed the weight (truncated or dropped)


def geometric_mean_weights(log_w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's geometric-mean weight exp(sum_t m_t log w_t / sum_t m_t): (B, L) x2 -> (B,);
    1 for a row without tokens."""
    return ((log_w * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).exp()


def _inside(values: torch.Tensor, band: tuple[float, float]) -> torch.Tensor:
    return (values >= band[0]) & (values <= band[1])


def _checked_band(method: str, cap: float | None, band: tuple[float, float] | None) -> tuple[float, float]:
    """The band of a masked method (validated), (0, inf) for the others; raises on a bad method or cap."""
    if method not in OFF_POLICY_METHODS[1:]:
        raise ValueError(f"behaviour_weights: method must be one of {OFF_POLICY_METHODS[1:]}, got {method!r}")
    if cap is not None and cap <= 1.0:
        raise ValueError(f"the importance-weight cap must be > 1 (or None), got {cap}")
    if method not in MASKED_METHODS:
        return (0.0, math.inf)
    if band is None or not (0.0 < band[0] <= 1.0 <= band[1] and band[0] < band[1]):
        raise ValueError(
            f"method {method!r} needs a band (low, high) with 0 < low <= 1 <= high and low < high, got {band}"
        )
    return band


def behaviour_weights(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    method: str,
    cap: float | None,
    band: tuple[float, float] | None = None,
) -> BehaviourWeights:
    """w = exp(clamp(prox_logp - behav_logp, +-20)) per token, bounded by the cap C or the band:
    "tis" truncates (w <- min(w, C)); "decoupled" drops the token (w <- 0 where w > C, AReaL's
    behaviour-weight cap); "seq_mask_tis" truncates like "tis" and drops every token of a row
    whose geometric-mean weight lies outside band = (low, high); "icepop" keeps w where
    low <= w <= high and drops the token otherwise (both sides; C unused). cap=None: no cap.
    (B, L) x3 -> BehaviourWeights.
    """
    low_high = _checked_band(method, cap, band)
    log_w = (prox_logp.detach() - behav_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    raw = log_w.exp() * mask
    zero = torch.zeros_like(raw)
    if method == "icepop":
        keep = _inside(raw, low_high)
        dropped = (~keep).to(raw.dtype) * mask
        return BehaviourWeights(weight=torch.where(keep, raw, zero), raw=raw, capped=dropped)
    over = (raw > cap).to(raw.dtype) * mask if cap is not None else zero
    if method == "decoupled":
        return BehaviourWeights(weight=torch.where(over > 0, zero, raw), raw=raw, capped=over)
    weight = raw if cap is None else raw.clamp(max=cap)
    if method == "tis":
        return BehaviourWeights(weight=weight, raw=raw, capped=over)
    kept_rows = _inside(geometric_mean_weights(log_w, mask), low_high)[:, None].to(raw.dtype)
    dropped = (1.0 - kept_rows) * mask
    return BehaviourWeights(weight=weight * kept_rows, raw=raw, capped=torch.maximum(over, dropped))


def off_policy_policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    method: str,
    cap: float | None,
    clip_low: float,
    clip_high: float,
    clip_c: float,
    band: tuple[float, float] | None = None,
) -> tuple[PolicyLoss, BehaviourWeights]:
    """The PPO loss corrected for a stale / mismatched sampler (three policies):
    loss = w * ppo_policy_loss(logp, prox_logp, A) per token, w = `behaviour_weights(prox_logp,
    behav_logp, method=, cap=, band=)` detached. logp (B, L) with grad = pi_theta; prox_logp (B, L)
    = the learner's recomputed log-probs at the step's start weights (the PPO trust region is centred on them);
    behav_logp (B, L) = the sampler's recorded log-probs. clipped / clipped_lower / approx_kl are
    those of the surrogate around prox_logp (unweighted)."""
    surrogate = ppo_policy_loss(
        logp, prox_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c
    )
    w = behaviour_weights(prox_logp, behav_logp, mask, method=method, cap=cap, band=band)
    return PolicyLoss(
        loss=surrogate.loss * w.weight,
        clipped=surrogate.clipped,
        clipped_lower=surrogate.clipped_lower,
        approx_kl=surrogate.approx_kl,
    ), w


def staleness(row_versions: torch.Tensor, learner_version: int) -> torch.Tensor:
    """Per-row staleness = learner_version - row_version for stamped rows (row_version >= 0;
    -1 = unknown). (B,) int64 -> (b,) int64 over the stamped rows only. A row newer than the
    learner (negative staleness) is an error: those weights do not exist on this learner."""
    stamped = row_versions[row_versions >= 0]
    lag = learner_version - stamped
    if bool((lag < 0).any()):
        raise ValueError(
            f"rows stamped with policy_version {int(stamped.max())} but the learner is at version "
            f"{learner_version}: the rows were sampled with weights this learner never produced "
            "(was it restored from an older checkpoint than the rollout engines?)"
        )
    return lag


# ---------------------------------------------------------------------------------------------
# KL to the reference policy


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


def _k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    x = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (x.exp() - x - 1.0).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "abs": _abs,
    "k2": _k2,
    "k3": _k3,
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference: (B, L), (B, L) -> (B, L).

    k1 = logp - ref; abs = |k1|; k2 = k1^2 / 2; k3 = e^x - x - 1 with x = clamp(ref - logp, +-20),
    clamped to [-10, 10]. A trailing "+" (e.g. "k3+") is straight-through: the forward value of
    the named estimator with the k2 gradient (the reverse-KL gradient; plain k3 as a loss gives
    the forward-KL gradient on on-policy samples, docs/algorithms.md a.4).
    """
    straight_through = kind.endswith("+")
    base = kind.removesuffix("+")
    if base not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; known: {sorted(KL_ESTIMATORS)} (+ suffix)")
    value = KL_ESTIMATORS[base](logp, ref_logp)
    if not straight_through:
        return value
    k2 = _k2(logp, ref_logp)
    return k2 + (value - k2).detach()


# ---------------------------------------------------------------------------------------------
# aggregation: every mode is numerator(rows) / denominator(whole mini-batch)


def _row_weights(mask: torch.Tensor, row_weights: torch.Tensor | None) -> torch.Tensor:
    if row_weights is None:
        return torch.ones(mask.shape[0], dtype=mask.dtype, device=mask.device)
    return row_weights.to(mask)


def _seq_nonempty(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(-1) > 0).to(mask.dtype)


def _num_token_mean(values, mask, w):
    return (w[:, None] * mask * values).sum()


def _num_seq_mean_token_mean(values, mask, w):
    return (w * (mask * values).sum(-1) / mask.sum(-1).clamp_min(1.0)).sum()


def _num_seq_token_sum(values, mask, w):
    return (w * (mask * values).sum(-1)).sum()


def _den_tokens(mask, w, norm_length):
    return (w[:, None] * mask).sum()


def _den_seqs(mask, w, norm_length):
    return (w * _seq_nonempty(mask)).sum()


def _den_seqs_times_length(mask, w, norm_length):
    return (w * _seq_nonempty(mask)).sum() * (mask.shape[-1] if norm_length is None else norm_length)


# mode -> (numerator over the given rows, denominator over the whole mini-batch)
AGG_MODES = {
    "token-mean": (_num_token_mean, _den_tokens),
    "seq-mean-token-mean": (_num_seq_mean_token_mean, _den_seqs),
    "seq-mean-token-sum": (_num_seq_token_sum, _den_seqs),
    "seq-mean-token-sum-norm": (_num_seq_token_sum, _den_seqs_times_length),
}


def agg_denominator(
    mask: torch.Tensor, mode: str, *, row_weights: torch.Tensor | None = None, norm_length: int | None = None
) -> float:
    """The denominator of `mode` over a whole mini-batch: (B, L) mask [, (B,) row weights] -> float.

    token-mean: sum_i w_i * num_tokens_i (the global token count when w = 1);
    seq-mean-*: sum_i w_i over non-empty rows; seq-mean-token-sum-norm: that times norm_length
    (default L). Compute it once over every row of the mini-batch on every rank, then pass it
    to `agg_loss` for each micro-batch.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg mode {mode!r}; known: {sorted(AGG_MODES)}")
    return float(AGG_MODES[mode][1](mask, _row_weights(mask, row_weights), norm_length))


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_denominator: float | None = None,
    row_weights: torch.Tensor | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Aggregate per-token values (B, L) to a scalar.

    token-mean: sum(w m v) / N_tok (GLOBAL token-mean when `global_denominator` is the mini-batch
    token count: the sum over micro-batches and ranks then equals the full-batch loss);
    seq-mean-token-mean: mean over non-empty rows of each row's token-mean; seq-mean-token-sum:
    mean over rows of each row's token-sum; seq-mean-token-sum-norm: token-sum / (rows x
    norm_length) (Dr.GRPO). `row_weights` (B,) scale each row (per-trajectory weighting).
    Without `global_denominator` the denominator is this batch's own (`agg_denominator`).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg mode {mode!r}; known: {sorted(AGG_MODES)}")
    numerator, denominator = AGG_MODES[mode]
    w = _row_weights(mask, row_weights)
    den = float(denominator(mask, w, norm_length)) if global_denominator is None else global_denominator
    return numerator(values, mask, w) / max(den, 1e-12)


# ---------------------------------------------------------------------------------------------
# diagnostics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: (..., V) -> (...), computed in float32.

    -inf logits (masked-out ids) contribute 0.
    """
    z = logits.float()
    log_p = torch.log_softmax(z, dim=-1)
    p = log_p.exp()
    return -(p * torch.where(p > 0, log_p, torch.zeros_like(log_p))).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """sum(mask * values) / sum(mask) as a float (0 for an empty mask)."""
    return float((values * mask).sum() / mask.sum().clamp_min(1e-12))
