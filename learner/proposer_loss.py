"""UniSkill's proposer loss in the learner step (docs/algorithms.md S3): the `AuxiliaryLoss` hook
that trains the valid proposals in the actor's optimiser steps, and the prop_* step metrics.
Its inputs come from `learner.proposer_pass`; the per-term math is `learner.uniskill`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.algos import agg_loss, kl_penalty
from learner.backends import TrainBackend
from learner.batch import select_rows
from learner.config import LearnerConfig
from learner.logprobs import response_logprobs_and_op_logits
from learner.proposer_pass import ProposalData
from learner.sharding import shard_micro_batches
from learner.types import Chunk
from learner.uniskill import proposer_pg_loss, support_regularizer


@dataclass(frozen=True)
class PropDenominators:
    """Proposer loss denominators over one mini-batch's proposals (all ranks)."""

    proposals: float  # seq-mean-token-mean of L_pg
    tokens: float  # token-mean of L_KL
    support: float  # proposals with a valid decision position (mean of L_sup)


class ProposerLoss:
    """`AuxiliaryLoss` (name "prop"): lambda_prop * (L_pg + beta_p * L_KL + c_sup * L_sup) on the
    proposals assigned to actor mini-batch k (`ProposalData.assignment[k]`), this rank's share
    from `shard_micro_batches`, with denominators over the mini-batch's whole share (proposals,
    tokens, support-valid proposals). `sums()`: loss (L_prop without lambda_prop), pg, kl, sup,
    clipped and tokens, summed over this rank's micro-batches of the step (all epochs)."""

    name = "prop"

    def __init__(
        self, data: ProposalData, *, cfg: LearnerConfig, backend: TrainBackend, rank: int, world_size: int
    ) -> None:
        self.data, self.cfg, self.backend = data, cfg, backend
        self.rank, self.world_size = rank, world_size
        self._lengths = data.batch.attention_mask.sum(-1)
        self._sums = dict.fromkeys(("loss", "pg", "kl", "sup", "clipped", "tokens"), 0.0)

    def micro_batches(self, k: int) -> list[Chunk]:
        return shard_micro_batches(
            self._lengths, self.data.assignment[k], rank=self.rank, world_size=self.world_size,
            micro_rows=self.cfg.micro_batch_rows, max_tokens=self.cfg.max_tokens_per_micro_batch,
        )  # fmt: skip

    def _denominators(self, k: int) -> PropDenominators:
        assigned = self.data.assignment[k]
        return PropDenominators(
            proposals=float(len(assigned)),
            tokens=float(self.data.batch.response_mask[assigned].sum()),
            support=float(self.data.support_valid[assigned].sum()),
        )

    def __call__(self, rows: torch.Tensor, real: bool, k: int) -> torch.Tensor:
        prop, cfg, pc, device = self.data, self.cfg, self.cfg.proposer, self.backend.device
        den = self._denominators(k)
        micro = select_rows(prop.batch, rows)
        cols = slice(0, micro.response_length)
        mask = micro.response_mask.to(device) * float(real)
        with self.backend.autocast():
            logp, op_logits = response_logprobs_and_op_logits(
                self.backend.forward_module(), micro, temperature=cfg.temperature,
                positions=prop.positions[rows], op_token_ids=prop.op_ids[rows],
            )  # fmt: skip
        pg, clipped = proposer_pg_loss(
            logp, prop.old_logp[rows, cols].to(device), prop.advantages[rows].to(device), mask,
            clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high, clip_c=cfg.clip_ratio_c,
            num_proposals=den.proposals,
        )  # fmt: skip
        zero = torch.zeros((), device=device)
        kl = zero
        if prop.ref_logp is not None:
            per_token = kl_penalty(logp, prop.ref_logp[rows, cols].to(device), pc.kl_type)
            kl = agg_loss(per_token, mask, "token-mean", global_denominator=den.tokens)
        sup = zero
        valid = (prop.support_valid[rows] & real).to(device)
        if bool(valid.any()):
            per_row = support_regularizer(
                op_logits[valid], prop.legal[rows].to(device)[valid], p_min=pc.p_min
            )
            sup = per_row.sum() / max(den.support, 1.0)
        l_prop = pg + pc.beta_kl * kl + pc.c_sup * sup
        for name, value in (("loss", l_prop), ("pg", pg), ("kl", kl), ("sup", sup)):
            self._sums[name] += float(value.detach())
        self._sums["clipped"] += float(clipped.sum())
        self._sums["tokens"] += float(mask.sum())
        return (pc.lambda_prop if pc.train_proposer else 0.0) * l_prop

    def sums(self) -> dict[str, float]:
        return dict(self._sums)


def proposal_metrics(prop: ProposalData, sums: dict[str, float], *, steps: int) -> dict[str, float]:
    """prop_*: proposer loss terms (mean over optimiser steps, L_prop without lambda_prop, from
    the rank-summed "prop/*" sums), rewards, op distribution among all proposals, valid rows,
    R_align."""
    scores = prop.scores
    valid = [s for s in scores if s.valid]
    aligned = [s.r_align for s in scores if s.r_align is not None]
    out = {
        "prop_loss": sums.get("prop/loss", 0.0) / steps,
        "prop_pg_loss": sums.get("prop/pg", 0.0) / steps,
        "prop_kl_loss": sums.get("prop/kl", 0.0) / steps,
        "prop_sup_loss": sums.get("prop/sup", 0.0) / steps,
        "prop_clipfrac": sums.get("prop/clipped", 0.0) / max(sums.get("prop/tokens", 0.0), 1.0),
        "prop_rows": float(len(scores)),
        "prop_valid_rows": float(len(valid)),
        "prop_support_rows": float(prop.support_valid.sum()),
        "prop_reward_mean": sum(s.reward or 0.0 for s in valid) / max(len(valid), 1),
        "prop_advantage_abs_mean": sum(abs(s.advantage or 0.0) for s in valid) / max(len(valid), 1),
        "prop_align_rows": float(len(aligned)),
        "prop_r_align_mean": sum(aligned) / max(len(aligned), 1),
    }
    return out | {f"prop_op_{op}": v for op, v in prop.op_fractions.items()}
