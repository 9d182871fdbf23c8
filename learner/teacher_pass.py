"""SMRC-SD in the learner step (docs/algorithms.md S2, d): the teacher log-prob pass at theta_old,
the routed-SD hook built from the config, and the sd_* step metrics.

The loss itself is `learner.distill.RoutedSDLoss`, an `ExtraLoss` on the actor's micro-batches:
the worker hands it this pass's teacher log-probs once per step and the "matched_tokens"
denominator through `MicroBatchView.global_matched_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from learner.batch import collate_rows, select_rows, teacher_rows
from learner.config import DistillConfig
from learner.distill import RoutedSDLoss
from learner.sharding import split_micro_batches
from learner.types import Chunk, TokenBatch, TrainRow


@dataclass(frozen=True)
class TeacherPass:
    """SMRC-SD teacher log-probs at theta_old (docs/algorithms.md S2, d); rows of this rank are filled."""

    teacher_logp: torch.Tensor  # (N, L_r) float32: response log-probs under the teacher prompt
    match: torch.Tensor  # (N,) bool: the row has a teacher prompt (M_i)


def build_sd_loss(sd: DistillConfig) -> RoutedSDLoss | None:
    """The "sd" `ExtraLoss` of `LearnerConfig.sd`; None when lambda_SD is 0 (no teacher pass)."""
    if sd.coef <= 0:
        return None
    return RoutedSDLoss(
        lam=sd.coef, form=sd.form, denominator=sd.denominator, beta=sd.sdar_beta,
        warm_down=sd.warm_down, total_steps=sd.total_steps,
    )  # fmt: skip


def teacher_chunks(
    lengths: torch.Tensor, mine: Sequence[torch.Tensor], *, rank: int, micro_rows: int, max_tokens: int | None = None
) -> list[Chunk]:
    """Micro-batches of rank `rank` over the teacher rows, given the teacher rows' token counts
    `lengths` and every rank's teacher-row positions `mine`: each rank's rows sorted by length and
    split into `micro_rows` rows, or packed by `max_tokens` (`split_micro_batches`, as the actor
    pass), then padded with (the shortest teacher row of this rank, real=False; of all when it
    owns none) to the largest count of any rank. A rank that owns no teacher row gets padding only."""
    split = [split_micro_batches(lengths, m, micro_rows=micro_rows, max_tokens=max_tokens) for m in mine]
    count = max(len(s) for s in split)
    pool = mine[rank] if len(mine[rank]) else torch.arange(len(lengths))
    padding = pool[torch.argsort(lengths[pool], stable=True)[:1]]
    return [(c, True) for c in split[rank]] + [(padding, False)] * (count - len(split[rank]))


@torch.no_grad()
def teacher_logprobs(
    rows: Sequence[TrainRow],
    batch: TokenBatch,
    owned: Sequence[torch.Tensor],
    *,
    rank: int,
    micro_rows: int,
    pad_token_id: int,
    policy: Callable[[TokenBatch], torch.Tensor],
    max_tokens: int | None = None,
) -> TeacherPass:
    """Part of the step's no-grad pass: the rows with `teacher_prompt_ids` that this rank trains
    on (`owned[r]`: (N,) bool rows of rank r, for every rank) are re-scored by `policy` (response
    log-probs at theta_old) under the teacher prompt (left-padded) + the IDENTICAL response ids
    (and the same allowed-id constraint). Needed in "sampler" mode too (only these rows are
    forwarded then). The teacher rows are packed by `max_tokens` (`learner.max_tokens_per_micro_batch`)
    under their own lengths (teacher prompt + response), else split into `micro_rows` rows. Every
    rank runs the same number of forwards (zero-weight repeats of one teacher row pad the short
    ranks) so ZeRO collectives line up."""
    match = torch.tensor([r.teacher_prompt_ids is not None for r in rows], dtype=torch.bool)
    teacher_logp = torch.zeros(batch.num_rows, batch.response_length)
    if not bool(match.any()):
        return TeacherPass(teacher_logp=teacher_logp, match=match)
    matched = torch.nonzero(match).squeeze(-1)  # batch row of each teacher row
    t_batch = collate_rows(teacher_rows(rows), pad_token_id=pad_token_id)
    mine = [torch.nonzero(o[matched]).squeeze(-1) for o in owned]  # teacher-row positions per rank
    t_lengths = t_batch.attention_mask.sum(-1)
    for t_idx, real in teacher_chunks(t_lengths, mine, rank=rank, micro_rows=micro_rows, max_tokens=max_tokens):
        t_micro = select_rows(t_batch, t_idx)
        logp = policy(t_micro)
        if real:
            teacher_logp[matched[t_idx], : t_micro.response_length] = logp.float().cpu()
    return TeacherPass(teacher_logp=teacher_logp, match=match)


def sd_metrics(teacher: TeacherPass, batch: TokenBatch, sums: dict[str, float]) -> dict[str, float]:
    """sd_*: match rate and teacher tokens of the step, d and k3 means over the matched tokens
    (from the rank-summed "sd/*" sums of `RoutedSDLoss.sums`)."""
    matched_sum = max(sums.get("sd/matched", 0.0), 1e-12)
    return {
        "sd_match_rate": float(teacher.match.float().mean()),
        "sd_teacher_tokens": float(batch.response_mask[teacher.match].sum()),
        "sd_d_mean": sums.get("sd/d", 0.0) / matched_sum,
        "sd_k_mean": sums.get("sd/k", 0.0) / matched_sum,
    }
