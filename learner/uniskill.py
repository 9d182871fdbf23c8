"""UniSkill's proposer-side math as pure torch functions (docs/algorithms.md S3, S4). No IO, no config
objects: tensors and keyword scalars in, tensors or small frozen records out.

- `whiten_rewards`: REINFORCE++ batch whitening of one scalar reward per proposal.
- `r_skill` / `composite_reward`: the reward channels and their composite per op (S3).
- `step_payload_means` / `trajectory_logprob`: J(tau; s), a mean of per-step token means over the
  action-payload tokens only (S4).
- `align_from_step_means`: Delta+, Delta-, R_align and the coverage gate (S4).
- `support_regularizer`: L_sup per proposal from the logits at the op decision position (S3).
- `proposer_pg_loss`: PPO clip on whitened proposal advantages, seq-mean-token-mean aggregated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from learner.algos import agg_loss, broadcast_advantages, ppo_policy_loss

WHITEN_EPS = 1e-8


# ---------------------------------------------------------------------------------------------
# rewards and advantages


def whiten_rewards(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """A_j = (r_j - mean) / sqrt(var_unbiased + 1e-8) over the valid rows: (n,) [, (n,) bool] -> (n,).

    Invalid (padding / dropped) rows neither enter the statistics nor get an advantage (0).
    Fewer than two valid rows give 0 (REINFORCE++ on one sample has no baseline); constant
    rewards give exactly 0.
    """
    r = rewards.float()
    keep = torch.ones_like(r, dtype=torch.bool) if valid is None else valid.bool()
    out = torch.zeros_like(r)
    n = int(keep.sum())
    if n < 2:
        return out
    vals = r[keep]
    centred = vals - vals.mean()
    var = (centred**2).sum() / (n - 1)
    out[keep] = centred / torch.sqrt(var + WHITEN_EPS)
    return out


def r_skill(
    *,
    content_supported: bool | None,
    has_chinese: bool,
    r_align: float | None,
    eta: float,
    use_r_align: bool = True,
) -> tuple[float | None, str]:
    """(r_skill, reason) of an ADD/UPDATE proposal (S3); None = masked, with the reason.

    Chinese text or an unsupported verdict give -eta whatever R_align is. A supported verdict
    gives clip(R_align, -eta, eta), or None when R_align is missing (coverage, scoring failure).
    No critic verdict (None) masks the channel. `use_r_align=False` (ablation) gives +eta for a
    supported verdict.
    """
    if has_chinese:
        return -eta, "chinese text"
    if content_supported is None:
        return None, "no content verdict"
    if not content_supported:
        return -eta, ""
    if not use_r_align:
        return eta, ""
    if r_align is None:
        return None, "no R_align"
    return max(-eta, min(eta, float(r_align))), ""


def composite_reward(
    op: str | None, *, r_fmt: float, r_op: float | None, r_skill: float | None, warmup: bool = False
) -> tuple[float | None, str]:
    """(reward, reason) of one proposal (S3); None = drop the row from the proposer loss.

    warm-up: r_fmt only. Parse failure (op None): r_fmt. NO_SKILL: r_fmt + r_op (no skill term).
    ADD/UPDATE: r_fmt + r_op + r_skill. A missing required component drops the row.
    """
    if warmup:
        return float(r_fmt), "warm-up"
    if op is None:
        return float(r_fmt), "parse failure"
    if r_op is None:
        return None, "no op verdict"
    if op == "no_edit":
        return float(r_fmt) + float(r_op), ""
    if op not in ("add", "update"):
        raise ValueError(f"unknown proposal op {op!r}; known: no_edit, add, update, None")
    if r_skill is None:
        return None, "no r_skill"
    return float(r_fmt) + float(r_op) + float(r_skill), ""


# ---------------------------------------------------------------------------------------------
# R_align


def step_payload_means(logp: torch.Tensor, payload_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step token means over the payload tokens: (S, L), (S, L) {0,1} -> ((S,) means, (S,) scorable).

    A step with no payload token is not scorable (its mean is 0 and must not be used).
    """
    m = payload_mask.to(logp.dtype)
    count = m.sum(-1)
    return (logp * m).sum(-1) / count.clamp_min(1.0), count > 0


def trajectory_logprob(logp: torch.Tensor, payload_mask: torch.Tensor) -> float | None:
    """J(tau; s) = mean over scorable steps of the per-step payload token mean (S4), from the
    (S, L) log-probs of the trajectory's steps; None when no step is scorable."""
    means, scorable = step_payload_means(logp, payload_mask)
    if not bool(scorable.any()):
        return None
    return float(means[scorable].mean())


@dataclass(frozen=True)
class AlignOutcome:
    """R_align of one candidate (raw, unclipped); None parts when the gate failed (`reason`)."""

    r_align: float | None
    delta_plus: float | None
    delta_minus: float | None
    coverage_plus: float
    coverage_minus: float
    reason: str = ""


def align_from_step_means(
    plus_orig: torch.Tensor,
    plus_swapped: torch.Tensor,
    minus_orig: torch.Tensor,
    minus_swapped: torch.Tensor,
    *,
    plus_turns: int,
    minus_turns: int,
    coverage_min: float = 0.8,
    plus_forced: int = 0,
    minus_forced: int = 0,
) -> AlignOutcome:
    """Delta+/- and R_align from per-scorable-step payload means (each (n_+,) or (n_-,)).

    Delta = mean(swapped) - mean(orig) (J is a mean of per-step means); R_align = Delta+ - Delta-.
    Coverage = scorable steps / T_tau for each anchor; below `coverage_min` on either anchor
    the outcome has no R_align (reason "coverage 0.6 < 0.8"). `plus_forced` / `minus_forced`:
    turns whose payload the decoding constraint fixed entirely (every payload token the only
    allowed id): they count as covered but take no part in the means (their Delta is exactly 0
    whatever the skill); an anchor with only such turns has no R_align.
    """
    cov_plus = (len(plus_orig) + plus_forced) / plus_turns
    cov_minus = (len(minus_orig) + minus_forced) / minus_turns
    for name, cov, free in (("plus", cov_plus, len(plus_orig)), ("minus", cov_minus, len(minus_orig))):
        if cov < coverage_min or cov == 0:
            return AlignOutcome(
                None, None, None, cov_plus, cov_minus, f"{name} coverage {cov:.3g} < {coverage_min:g}"
            )
        if free == 0:
            return AlignOutcome(None, None, None, cov_plus, cov_minus, f"{name}: every payload token was forced")
    d_plus = float(plus_swapped.double().mean() - plus_orig.double().mean())
    d_minus = float(minus_swapped.double().mean() - minus_orig.double().mean())
    return AlignOutcome(d_plus - d_minus, d_plus, d_minus, cov_plus, cov_minus)


# ---------------------------------------------------------------------------------------------
# proposer losses


def support_regularizer(op_logits: torch.Tensor, legal: torch.Tensor, *, p_min: float = 0.1) -> torch.Tensor:
    """L_sup per proposal: (B, 3) temperature-scaled logits of the op first tokens at the decision
    position, (B, 3) bool legal ops -> (B,).

    log p~ = log_softmax over the legal ops only (illegal ops get probability exactly 0);
    L_sup = mean over legal ops of relu(log p_min - log p~)^2. Needs >= 2 legal ops per row and
    |legal| * p_min < 1, else raises ValueError (the floor would be unsatisfiable or vacuous).
    """
    legal = legal.bool()
    n_legal = legal.sum(-1)
    if bool((n_legal < 2).any()):
        raise ValueError("the support regulariser needs at least 2 legal ops per proposal")
    if not 0 < p_min or bool((n_legal.float() * p_min >= 1).any()):
        raise ValueError(
            f"the support regulariser needs 0 < p_min and |legal| * p_min < 1, got p_min={p_min}"
        )
    log_p = torch.log_softmax(op_logits.float().masked_fill(~legal, float("-inf")), dim=-1)
    safe = torch.where(legal, log_p, torch.zeros_like(log_p))  # keeps -inf out of the backward pass
    violation = torch.relu(math.log(p_min) - safe) * legal
    return (violation**2).sum(-1) / n_legal.to(violation.dtype)


def legal_op_probs(op_logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Renormalised op probabilities over the legal ops (illegal = exactly 0): (B, 3) -> (B, 3)."""
    return torch.softmax(op_logits.float().masked_fill(~legal.bool(), float("-inf")), dim=-1)


def proposer_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float,
    num_proposals: float,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip on proposal rows with one advantage per row broadcast over its generated tokens,
    aggregated seq-mean-token-mean with the global proposal count `num_proposals` (so splits
    over micro-batches and ranks add up). (B, L) x 2, (B,), (B, L) -> (loss, (B, L) clipped flags)."""
    adv = broadcast_advantages(advantages, mask)
    pl = ppo_policy_loss(logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    loss = agg_loss(
        pl.loss, mask, "seq-mean-token-mean", global_denominator=num_proposals, row_weights=row_weights
    )
    return loss, pl.clipped
