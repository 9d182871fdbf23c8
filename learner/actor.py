"""The GRPO actor terms of the learner step (docs/algorithms.md S1): row scores, advantages and
weights, the no-grad pass at theta_old (old / reference log-probs, entropy), the mini-batch
denominators, and the PPO loss of one micro-batch with its `ExtraLoss` hooks.

Functions of tensors, the config and a scoring callable; the worker owns the model and the loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from learner.algos import (
    PolicyLoss,
    agg_denominator,
    agg_loss,
    broadcast_advantages,
    cap_invalid_advantages,
    grpo_advantages,
    kl_penalty,
    off_policy_policy_loss,
    penalised_scores,
    ppo_policy_loss,
)
from learner.batch import select_rows
from learner.config import LearnerConfig
from learner.distill import sd_denominator
from learner.gigpo import gigpo_advantages
from learner.logprobs import ResponseScores
from learner.metrics import OldPass, Tally
from learner.off_policy import weight_band
from learner.types import Chunk, ExtraLoss, MicroBatchView, TokenBatch

ROW_WEIGHTINGS: dict[str, Callable[[TokenBatch], torch.Tensor]] = {
    "none": lambda b: torch.ones(b.num_rows),
    "per_trajectory": lambda b: 1.0 / b.traj_num_rows.float(),
}

PolicyScorer = Callable[..., ResponseScores]
"""policy(micro, with_entropy=bool) -> ResponseScores of the current policy (grad unless no_grad)."""


@dataclass(frozen=True)
class StepData:
    """What the actor update reads; fixed for the whole step."""

    batch: TokenBatch
    old: OldPass
    advantages: torch.Tensor  # (N,) GRPO advantage per row
    weights: torch.Tensor  # (N,) row weights (ROW_WEIGHTINGS)


@dataclass(frozen=True)
class Denominators:
    """Loss denominators over one whole mini-batch (all micro-batches, all ranks)."""

    loss: float  # of cfg.loss_agg
    num_tokens: float  # weighted response tokens (token-mean), handed to extra losses
    matched_tokens: float  # the same over rows with a teacher prompt (0 without a teacher pass)


def row_scores(cfg: LearnerConfig, batch: TokenBatch) -> torch.Tensor:
    """(N,) s_i = R(tau) - c_inv * [invalid action] (S1)."""
    penalty = cfg.invalid_action_penalty
    return penalised_scores(batch.episode_scores, batch.action_valid, invalid_action_penalty=penalty)


def row_advantages(cfg: LearnerConfig, batch: TokenBatch) -> torch.Tensor:
    """(N,) GRPO (or GiGPO, `cfg.adv_estimator`) advantage per row over ALL rows (S1), so group
    statistics never depend on sharding."""
    if cfg.adv_estimator == "gigpo":
        if batch.anchor_index is None or batch.step_returns is None:
            raise ValueError("adv_estimator=gigpo needs anchor keys and step returns (learner.batch.collate_rows)")
        adv = gigpo_advantages(
            row_scores(cfg, batch), batch.group_index, batch.traj_index, batch.step_returns, batch.anchor_index,
            omega=cfg.gigpo_omega, mode=cfg.gigpo_mode, cross_step=cfg.adv_cross_step,
            singleton_zero=cfg.singleton_group_zero,
        )
        return cap_invalid_advantages(adv, batch.action_valid) if cfg.cap_invalid_advantage else adv
    adv = grpo_advantages(
        row_scores(cfg, batch),
        batch.group_index,
        batch.traj_index,
        cross_step=cfg.adv_cross_step,
        norm_by_std=cfg.norm_adv_by_std,
        singleton_zero=cfg.singleton_group_zero,
    )
    return cap_invalid_advantages(adv, batch.action_valid) if cfg.cap_invalid_advantage else adv


def denominators(
    cfg: LearnerConfig, data: StepData, mini: torch.Tensor, match: torch.Tensor | None
) -> Denominators:
    """The denominators of mini-batch `mini` (row indices); `match` (N,) = rows with a teacher prompt."""
    mask, w = data.batch.response_mask[mini], data.weights[mini]
    matched = 0.0
    if match is not None:
        matched = sd_denominator(mask, match[mini], denominator="matched_tokens", row_weights=w)
    return Denominators(
        loss=agg_denominator(mask, cfg.loss_agg, row_weights=w, norm_length=data.batch.response_length),
        num_tokens=agg_denominator(mask, "token-mean", row_weights=w),
        matched_tokens=matched,
    )


@torch.no_grad()
def old_and_ref_logprobs(
    cfg: LearnerConfig,
    batch: TokenBatch,
    shards: Sequence[list[Chunk]],
    *,
    policy: PolicyScorer,
    reference: Callable[[TokenBatch], torch.Tensor] | None,
) -> OldPass:
    """theta_old log-probs and entropy (and the reference's log-probs when the actor has a KL
    term; `reference(micro)` gives its response log-probs) of this rank's rows, from its
    micro-batches `shards` (one list per mini-batch).
    old_logprobs="sampler" without an actor KL forwards nothing: theta_old = the engine's."""
    actor_ref = reference is not None and cfg.kl_coef > 0  # (the proposer may need one alone)
    if cfg.old_logprobs == "sampler" and not actor_ref:
        owned = torch.zeros(batch.num_rows, dtype=torch.bool)
        for chunks in shards:
            for idx, real in chunks:
                owned[idx] = owned[idx] | real
        return OldPass(old_logp=batch.sampler_logp.clone(), ref_logp=None, entropy=None, owned=owned)
    shape = (batch.num_rows, batch.response_length)
    old, entropy = torch.zeros(shape), (torch.zeros(shape) if cfg.log_entropy else None)
    ref = torch.zeros(shape) if actor_ref else None
    owned = torch.zeros(batch.num_rows, dtype=torch.bool)
    for chunks in shards:
        for idx, real in chunks:
            micro = select_rows(batch, idx)
            cols = slice(0, micro.response_length)
            scores = policy(micro, with_entropy=entropy is not None)
            if ref is not None and reference is not None:
                ref_logp = reference(micro)
                if real:
                    ref[idx, cols] = ref_logp.float().cpu()
            if real:
                old[idx, cols] = (
                    batch.sampler_logp[idx, cols]
                    if cfg.old_logprobs == "sampler"
                    else scores.logp.float().cpu()
                )
                if entropy is not None and scores.entropy is not None:
                    entropy[idx, cols] = scores.entropy.float().cpu()
                owned[idx] = True
    return OldPass(old_logp=old, ref_logp=ref, entropy=entropy, owned=owned, recomputed=True)


def actor_micro_loss(
    cfg: LearnerConfig,
    data: StepData,
    idx: torch.Tensor,
    real: bool,
    den: Denominators,
    tally: Tally,
    *,
    policy: PolicyScorer,
    device: torch.device,
    extra_losses: Sequence[ExtraLoss],
    first_pass: bool = True,
) -> torch.Tensor:
    """GRPO loss of one micro-batch (+ extra losses), aggregated with mini-batch denominators.
    A padding micro-batch (real=False) runs forward/backward with an all-zero mask."""
    micro = select_rows(data.batch, idx)
    cols = slice(0, micro.response_length)
    mask = micro.response_mask.to(device) * float(real)
    w = data.weights[idx].to(device)
    old_logp = data.old.old_logp[idx, cols].to(device)
    adv = broadcast_advantages(data.advantages[idx].to(device), mask)
    tally_old = first_pass and not data.old.recomputed  # "sampler" mode: measure here
    scores = policy(micro, with_entropy=cfg.entropy_coeff > 0 or (tally_old and cfg.log_entropy))
    if tally_old:
        if cfg.log_entropy and scores.entropy is not None:
            tally.add("entropy_sum", (scores.entropy.detach() * mask).sum())
        tally.add("sampler_diff_sum", ((scores.logp.detach() - old_logp).abs() * mask).sum())
        tally.add_mismatch(micro.sampler_logp.to(device), scores.logp.detach(), mask)
    if cfg.off_policy == "none":
        pl = ppo_policy_loss(
            scores.logp, old_logp, adv, mask,
            clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high, clip_c=cfg.clip_ratio_c,
        )  # fmt: skip
    else:  # old_logp = pi_prox (recomputed), the sampler's log-probs = pi_behav (docs/algorithms.md)
        pl, _ = off_policy_policy_loss(
            scores.logp, old_logp, micro.sampler_logp.to(device), adv, mask,
            method=cfg.off_policy, cap=cfg.tis_cap, band=weight_band(cfg),
            clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high, clip_c=cfg.clip_ratio_c,
        )  # fmt: skip
    agg = functools.partial(
        agg_loss, mask=mask, mode=cfg.loss_agg, global_denominator=den.loss,
        row_weights=w, norm_length=data.batch.response_length,
    )  # fmt: skip
    zero = torch.zeros((), device=device)
    terms = {"pg_loss": agg(pl.loss), "kl_loss": zero, "entropy_loss": zero}
    if data.old.ref_logp is not None:
        ref_logp = data.old.ref_logp[idx, cols].to(device)
        terms["kl_loss"] = agg(kl_penalty(scores.logp, ref_logp, cfg.kl_type))
    if cfg.entropy_coeff > 0:
        terms["entropy_loss"] = agg(scores.entropy)
    view = MicroBatchView(
        micro, scores.logp, old_logp, adv, w * float(real), den.num_tokens, den.matched_tokens
    )
    extras = {hook.name: hook(view) for hook in extra_losses}
    total = (
        terms["pg_loss"] + cfg.kl_coef * terms["kl_loss"] - cfg.entropy_coeff * terms["entropy_loss"]
    ) + sum(extras.values(), zero)
    _record(tally, {"loss": total, **terms, **{f"extra/{k}": v for k, v in extras.items()}}, pl, mask)
    # UniSkill proposer_only: logged as usual, no gradient (x 0 keeps the graph, as padding micro-batches do)
    return total if cfg.proposer.train_actor else total * 0.0


def _record(tally: Tally, losses: dict[str, torch.Tensor], pl: PolicyLoss, mask: torch.Tensor) -> None:
    for name, value in losses.items():
        tally.add(name, value.detach())
    tally.add("clipped", pl.clipped.sum())
    tally.add("clipped_lower", pl.clipped_lower.sum())
    tally.add("approx_kl", pl.approx_kl.sum())
    tally.add("update_tokens", mask.sum())
