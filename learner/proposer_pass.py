"""UniSkill in the learner step (docs/algorithms.md S3, S4): R_align from the no-grad scoring pass,
the proposer rewards and their whitening, and the split of the proposals over the actor's
mini-batches. The proposer loss is `learner.proposer_loss.ProposerLoss`.

Every rank scores all proposals at theta_old and a 1/W share of the anchor turns, each under s~
and under s_orig in the same no-grad learner pass (per-turn payload means are summed over ranks;
J(s_orig) never comes from the engine's log-probs), so R_align, the rewards and the whitening are
identical on every rank. Actor mini-batch k then also backpropagates lambda_prop * L_prop of its
share of the valid proposals (split over ranks like the rows, denominators over the whole
mini-batch share) before its single optimiser step. Proposals dropped for a missing reward
component are excluded from every proposer term (policy gradient, KL and support regulariser).
The pure math is `learner.uniskill`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from learner.batch import collate_rows, select_rows
from learner.config import LearnerConfig
from learner.payload import free_payload_mask, payload_mask
from learner.sharding import shard_micro_batches
from learner.types import OP_ORDER, AlignRequest, ProposalRow, ProposalScore, TokenBatch, TrainRow
from learner.uniskill import (
    AlignOutcome,
    align_from_step_means,
    composite_reward,
    r_skill,
    step_payload_means,
    whiten_rewards,
)


@dataclass(frozen=True)
class AlignStep:
    """One scorable anchor turn of an R_align request (S4)."""

    request: int  # index into the step's AlignRequests
    side: str  # "plus" | "minus"
    row_index: int  # actor row (its own prompt shows s_orig)
    swapped_prompt_ids: tuple[int, ...]
    payload: torch.Tensor  # (len(response),) float {0,1}: payload tokens the constraint did not force


@dataclass(frozen=True)
class UniPass:
    """UniSkill part of the step's no-grad pass: proposals' theta_old/ref log-probs and the
    per-step payload means of every scorable anchor turn under s_orig and s~ (all ranks)."""

    aux: TokenBatch  # proposal rows 0..P-1, then the swapped-skill rows
    prop_old: torch.Tensor  # (P, L) theta_old log-probs of the proposal rows
    prop_ref: torch.Tensor | None  # (P, L) reference log-probs (None without the proposer KL)
    steps: list[AlignStep]
    orig_means: torch.Tensor  # (S,) payload token mean at theta_old under s_orig
    swapped_means: torch.Tensor  # (S,) the same under s~
    too_long: set[int]  # requests with an over-long scoring row
    forced: dict[tuple[int, str], int]  # (request, side) -> turns whose whole payload was forced


@dataclass(frozen=True)
class ProposalData:
    """What the proposer update reads; fixed for the whole step."""

    batch: TokenBatch  # rows 0..P-1 are the proposals (`UniPass.aux`)
    old_logp: torch.Tensor  # (P, L)
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor  # (P,) whitened over the valid proposals, 0 elsewhere
    positions: torch.Tensor  # (P,) int64 decision position (-1 = none)
    op_ids: torch.Tensor  # (P, 3) int64
    legal: torch.Tensor  # (P, 3) bool
    support_valid: torch.Tensor  # (P,) bool: L_sup applies
    assignment: list[torch.Tensor]  # valid proposal indices per actor mini-batch
    scores: list[ProposalScore]
    op_fractions: dict[str, float]  # no_edit / add / update / parse_fail among all proposals


# ---------------------------------------------------------------------------------------------
# inputs and the no-grad pass


def check_uniskill_inputs(
    enabled: bool, rows: Sequence[TrainRow], proposals: list[ProposalRow], align: list[AlignRequest]
) -> None:
    """ValueError naming the problem: proposals without `proposer.enabled`, duplicate candidate
    ids, align requests for unknown or repeated candidates, anchors that are not actor rows."""
    if not (proposals or align):
        return
    if not enabled:
        raise ValueError("train_step got UniSkill proposals/align requests but learner.proposer.enabled "
                         "is false; set learner.proposer.enabled=true")  # fmt: skip
    ids = [p.candidate_id for p in proposals]
    if len(set(ids)) != len(ids):
        raise ValueError("proposal candidate_ids must be unique within a train_step")
    seen: set[str] = set()
    for req in align:
        if req.candidate_id not in ids:
            raise ValueError(
                f"align request for unknown candidate {req.candidate_id!r}: pass its ProposalRow"
            )
        if req.candidate_id in seen:
            raise ValueError(f"two align requests for candidate {req.candidate_id!r}")
        seen.add(req.candidate_id)
        for anchor in req.plus + req.minus:
            if not 0 <= anchor.row_index < len(rows):
                raise ValueError(
                    f"align {req.candidate_id!r}: row_index {anchor.row_index} is not an actor row "
                    f"(0..{len(rows) - 1})"
                )


def payload_flags(row: TrainRow, tokenizer: Any) -> torch.Tensor:
    """(len(response),) {0,1} action-payload flags: the row's own, else from the tokenizer."""
    flags = row.payload_mask
    if flags is None:
        decode = functools.partial(
            tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        flags = payload_mask(row.response_ids, decode)
    return torch.tensor(flags, dtype=torch.float32)


def align_steps(
    rows: Sequence[TrainRow], align: list[AlignRequest], *, limit: int | None, tokenizer: Any
) -> tuple[list[AlignStep], set[int], dict[tuple[int, str], int]]:
    """The scorable anchor turns (non-empty payload) with their unforced payload tokens, the
    requests with a scoring row over `limit` tokens (prompt + response), and per (request, side)
    the count of turns whose whole payload the constraint forced (covered, not averaged; S4)."""
    payloads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    steps, too_long, forced = [], set(), {}
    for r, req in enumerate(align):
        for side, anchors in (("plus", req.plus), ("minus", req.minus)):
            for anchor in anchors:
                row = rows[anchor.row_index]
                if anchor.row_index not in payloads:
                    flags = payload_flags(row, tokenizer)
                    free = torch.tensor(free_payload_mask(flags.tolist(), row.allowed_token_ids), dtype=torch.float32)
                    payloads[anchor.row_index] = (flags, free)
                payload, free = payloads[anchor.row_index]
                if not bool(payload.any()):
                    continue  # not scorable: lowers coverage
                if limit is not None and len(anchor.swapped_prompt_ids) + len(row.response_ids) > limit:
                    too_long.add(r)
                    continue
                if not bool(free.any()):
                    forced[r, side] = forced.get((r, side), 0) + 1
                    continue
                steps.append(AlignStep(r, side, anchor.row_index, anchor.swapped_prompt_ids, free))
    return steps, too_long, forced


@torch.no_grad()
def uniskill_pass(
    rows: Sequence[TrainRow],
    proposals: list[ProposalRow],
    align: list[AlignRequest],
    *,
    cfg: LearnerConfig,
    rank: int,
    world_size: int,
    pad_token_id: int,
    tokenizer: Any,
    max_positions: int | None,
    policy: Callable[[TokenBatch], torch.Tensor],
    reference: Callable[[TokenBatch], torch.Tensor] | None,
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> UniPass:
    """Part of the step's no-grad pass at theta_old. One collated batch holds the proposal rows
    (scored on every rank: every rank trains a share of them), the swapped-skill rows of the
    scorable anchor turns and those turns' own rows (s_orig), both split over ranks by
    `shard_micro_batches` and packed by `learner.max_tokens_per_micro_batch` (else
    `micro_batch_rows` rows per micro-batch); the payload means are summed over ranks by `reduce` (each row is real
    on exactly one rank). `policy` / `reference` give response log-probs at theta_old / of the
    reference (None: no proposer KL). J(s_orig) and J(s~) thus come from the same learner pass,
    whatever `learner.old_logprobs` says (the engine's log-probs would bias Delta with bf16 engines)."""
    limits = [n for n in (cfg.proposer.max_scoring_tokens, max_positions) if n]
    steps, too_long, forced = align_steps(rows, align, limit=min(limits) if limits else None, tokenizer=tokenizer)
    prop_rows = [
        TrainRow(
            prompt_ids=p.prompt_ids, response_ids=p.response_ids,
            sampler_logprobs=p.sampler_logprobs or (0.0,) * len(p.response_ids),
            group_id="__proposal__", traj_id=p.candidate_id, step_idx=0, episode_score=0.0,
            action_valid=True,
        )
        for p in proposals
    ]  # fmt: skip
    swapped_rows = [
        rows[st.row_index].model_copy(
            update={"prompt_ids": st.swapped_prompt_ids, "teacher_prompt_ids": None, "payload_mask": None}
        )
        for st in steps
    ]
    orig_index = {i: k for k, i in enumerate(dict.fromkeys(st.row_index for st in steps))}
    orig_rows = [rows[i].model_copy(update={"teacher_prompt_ids": None, "payload_mask": None}) for i in orig_index]
    orig_payload = {orig_index[st.row_index]: st.payload for st in steps}
    aux = collate_rows(prop_rows + swapped_rows + orig_rows, pad_token_id=pad_token_id)
    n_prop, n_swap, n_orig = len(prop_rows), len(swapped_rows), len(orig_rows)
    chunks = shard_micro_batches(
        aux.attention_mask.sum(-1), n_prop + torch.arange(n_swap + n_orig), rank=rank, world_size=world_size,
        micro_rows=cfg.micro_batch_rows, shared=torch.arange(n_prop), max_tokens=cfg.max_tokens_per_micro_batch,
    )  # fmt: skip
    shape = (n_prop, aux.response_length)
    prop_old = torch.zeros(shape)
    prop_ref = torch.zeros(shape) if reference is not None and cfg.proposer.beta_kl > 0 else None
    swapped_means, orig_row_means = torch.zeros(n_swap), torch.zeros(n_orig)
    for idx, real in chunks:
        sub = select_rows(aux, idx)
        logp = policy(sub).float().cpu()
        if not real:
            continue
        for k, i in enumerate(idx.tolist()):
            if i < n_prop:
                prop_old[i, : sub.response_length] = logp[k]
                continue
            is_swap = i < n_prop + n_swap
            payload = steps[i - n_prop].payload if is_swap else orig_payload[i - n_prop - n_swap]
            mean = step_payload_means(logp[k : k + 1, : len(payload)], payload[None])[0][0]
            if is_swap:
                swapped_means[i - n_prop] = mean
            else:
                orig_row_means[i - n_prop - n_swap] = mean
        p_idx = idx[idx < n_prop]
        if prop_ref is not None and reference is not None and len(p_idx):
            p_sub = select_rows(aux, p_idx)
            prop_ref[p_idx, : p_sub.response_length] = reference(p_sub).float().cpu()
    reduced = reduce(torch.cat([orig_row_means, swapped_means]))
    orig_means = reduced[:n_orig][torch.tensor([orig_index[st.row_index] for st in steps], dtype=torch.long)]
    return UniPass(
        aux=aux, prop_old=prop_old, prop_ref=prop_ref, steps=steps,
        orig_means=orig_means, swapped_means=reduced[n_orig:], too_long=too_long, forced=forced,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# rewards and advantages


def align_outcomes(
    align: list[AlignRequest], uni: UniPass, *, coverage_min: float
) -> dict[str, AlignOutcome]:
    """R_align per candidate from the per-step payload means (S4), with the validity gates."""
    out: dict[str, AlignOutcome] = {}
    for r, req in enumerate(align):
        parts = {}
        for side in ("plus", "minus"):
            sel = torch.tensor([st.request == r and st.side == side for st in uni.steps], dtype=torch.bool)
            parts[side] = (uni.orig_means[sel], uni.swapped_means[sel])
        outcome = align_from_step_means(
            *parts["plus"], *parts["minus"], plus_turns=req.plus_turns, minus_turns=req.minus_turns,
            coverage_min=coverage_min, plus_forced=uni.forced.get((r, "plus"), 0),
            minus_forced=uni.forced.get((r, "minus"), 0),
        )  # fmt: skip
        if r in uni.too_long:
            outcome = AlignOutcome(
                None, None, None, outcome.coverage_plus, outcome.coverage_minus, "prompt too long"
            )
        out[req.candidate_id] = outcome
    return out


def proposal_data(
    proposals: list[ProposalRow],
    align: list[AlignRequest],
    uni: UniPass,
    *,
    cfg: LearnerConfig,
    n_minis: int,
    warmup: bool,
    version: int,
) -> ProposalData:
    """Rewards (S3), REINFORCE++ whitening over ALL valid proposals (identical on every rank),
    and the deterministic split of the valid proposals over the actor mini-batches (shuffled
    with a seed of `cfg.seed` and the policy `version`)."""
    pc = cfg.proposer
    outcomes = align_outcomes(align, uni, coverage_min=pc.coverage_min)
    missing = AlignOutcome(None, None, None, 0.0, 0.0, "warm-up" if warmup else "no align request")
    rewards, reasons, skills, used = [], [], [], []
    for p in proposals:
        outcome = outcomes.get(p.candidate_id, missing)
        skill, skill_reason = None, ""
        if not warmup and p.op in ("add", "update"):
            skill, skill_reason = r_skill(
                content_supported=p.content_supported, has_chinese=p.has_chinese,
                r_align=outcome.r_align, eta=pc.eta, use_r_align=pc.use_r_align,
            )  # fmt: skip
            if skill is None and skill_reason == "no R_align":
                skill_reason = outcome.reason
        reward, reason = composite_reward(p.op, r_fmt=p.r_fmt, r_op=p.r_op, r_skill=skill, warmup=warmup)
        if reward is None and skill_reason:
            reason = skill_reason
        rewards.append(0.0 if reward is None else reward)
        used.append(reward is not None)
        reasons.append(reason)
        skills.append(skill)
    valid = torch.tensor(used, dtype=torch.bool)
    advantages = whiten_rewards(torch.tensor(rewards, dtype=torch.float32), valid)
    scores = []
    for i, p in enumerate(proposals):
        o = outcomes.get(p.candidate_id, missing)
        scores.append(
            ProposalScore(
                candidate_id=p.candidate_id, r_align=o.r_align, delta_plus=o.delta_plus,
                delta_minus=o.delta_minus, coverage_plus=o.coverage_plus, coverage_minus=o.coverage_minus,
                r_skill=skills[i], reward=rewards[i] if used[i] else None,
                advantage=float(advantages[i]) if used[i] else None, valid=used[i], reason=reasons[i],
            )
        )  # fmt: skip
    order = torch.nonzero(valid).squeeze(-1)
    if cfg.shuffle_rows and len(order) > 1:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + version + 7_919)
        order = order[torch.randperm(len(order), generator=gen)]
    positions = torch.tensor([-1 if p.op_position is None else p.op_position for p in proposals])
    legal = torch.tensor([p.legal_ops for p in proposals], dtype=torch.bool)
    support_valid = (positions >= 0) & (legal.sum(-1) >= 2) & valid & pc.support_regularizer
    return ProposalData(
        batch=uni.aux, old_logp=uni.prop_old, ref_logp=uni.prop_ref, advantages=advantages,
        positions=positions, op_ids=torch.tensor([p.op_token_ids for p in proposals], dtype=torch.long),
        legal=legal, support_valid=support_valid, assignment=list(order.tensor_split(n_minis)),
        scores=scores,
        op_fractions={
            op: sum(p.op == key for p in proposals) / len(proposals)
            for op, key in (*((o, o) for o in OP_ORDER), ("parse_fail", None))
        },
    )  # fmt: skip
