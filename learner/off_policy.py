"""Step diagnostics of asynchronous training (docs/algorithms.md "Off-policy correction"): how
stale the step's rows are, and what the behaviour importance weights did. The loss itself is
`learner.algos.off_policy_policy_loss`, applied in `learner.actor.actor_micro_loss`."""

from __future__ import annotations

import torch

from learner.algos import behaviour_weights
from learner.config import LearnerConfig
from learner.metrics import OldPass
from learner.types import TokenBatch


def weight_band(cfg: LearnerConfig) -> tuple[float, float] | None:
    """The (low, high) keep band of `cfg.off_policy`'s mask (`learner.algos.behaviour_weights`):
    of each row's geometric-mean weight for seq_mask_tis, of each token's weight for icepop; None
    for the methods without one."""
    bands = {
        "seq_mask_tis": (cfg.seq_mask_low, cfg.seq_mask_high),
        "icepop": (cfg.icepop_low, cfg.icepop_high),
    }
    return bands.get(cfg.off_policy)


def staleness_metrics(lag: torch.Tensor) -> dict[str, float]:
    """async/row_staleness_mean and async/row_staleness_max over the step's stamped rows (`lag` from
    `learner.algos.staleness`, one entry per stamped row); {} when no row carries a version."""
    if lag.numel() == 0:
        return {}
    return {
        "async/row_staleness_mean": float(lag.double().mean()),
        "async/row_staleness_max": float(lag.max()),
    }


def behaviour_weight_sums(
    cfg: LearnerConfig, batch: TokenBatch, old: OldPass
) -> tuple[dict[str, float], float]:
    """This rank's sums of the behaviour weights w = pi_prox / pi_behav over the response tokens
    of its rows (the weights are fixed for the whole step: pi_prox is the step-start pass), and
    its largest raw w (0 without tokens). Sum the dict over ranks, take the max of the float."""
    owned_mask = batch.response_mask * old.owned[:, None].float()
    w = behaviour_weights(
        old.old_logp,
        batch.sampler_logp,
        owned_mask,
        method=cfg.off_policy,
        cap=cfg.tis_cap,
        band=weight_band(cfg),
    )
    sums = {"is_weight_sum": float(w.weight.sum()), "is_capped_sum": float(w.capped.sum())}
    return sums, float(w.raw.max()) if bool(owned_mask.any()) else 0.0


def behaviour_weight_metrics(sums: dict[str, float], raw_max: float) -> dict[str, float]:
    """async/is_weight_mean (the applied, capped weight, token-mean), async/is_weight_max (raw,
    before the cap) and async/is_capped_frac (share of tokens the cap truncated or a mask dropped) from
    rank-summed `behaviour_weight_sums` plus OldPass's owned_tokens."""
    tokens = max(sums["owned_tokens"], 1.0)
    return {
        "async/is_weight_mean": sums["is_weight_sum"] / tokens,
        "async/is_weight_max": raw_max,
        "async/is_capped_frac": sums["is_capped_sum"] / tokens,
    }
