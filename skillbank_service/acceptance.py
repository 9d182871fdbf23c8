"""The skill-bank acceptance rule of docs/algorithms.md S5 as a pure function (no IO).

Write-eligible: past warm-up (step > warmup_steps), op ADD or UPDATE, parsed, valid text, critic
verdict passed (op reasonable and content supported), scored (coverage ok, R_align and delta+
present and finite), delta+ > 0 and raw R_align > 0. Then:
- UPDATE: per (task_type, target skill id) the maximum raw R_align wins (ties: smallest candidate
  id); the others are "superseded". The target must exist in the bank with the same task type.
- ADD: in descending raw R_align order (ties: candidate id), exact duplicates keyed by
  (task_type, whitespace-normalised text) are skipped, within the batch and against the bank
  (including texts the winning UPDATEs of this batch write).

Every proposal gets exactly one outcome; the store turns the plan into decisions and writes.
Departure from S5: an UPDATE that would make its target identical to an existing skill's text
(its own included) is marked "duplicate" instead of writing a no-op or a twin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skillbank_service.types import Outcome, ScoredProposal
from skillbank_service.validation import normalise_text, validate_skill_text

DedupKey = tuple[str, str]


@dataclass(frozen=True)
class BankView:
    """What the rule needs to know about the bank: skill id -> (task_type, text) for (at least) the
    UPDATE targets of the batch, and dedup key -> skill id for (at least) the batch's keys. A
    store passes only those entries; without `index` the keys are derived from `skills`."""

    skills: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    index: Mapping[DedupKey, str] | None = None

    def keys(self) -> dict[DedupKey, str]:
        if self.index is not None:
            return dict(self.index)
        return {dedup_key(t, text): sid for sid, (t, text) in self.skills.items()}


@dataclass(frozen=True)
class Verdict:
    """The rule's outcome for one proposal (input order is kept by `AcceptancePlan.verdicts`)."""

    proposal: ScoredProposal
    outcome: Outcome
    reason: str = ""


@dataclass(frozen=True)
class AcceptancePlan:
    verdicts: tuple[Verdict, ...]
    """One per proposal, in input order."""
    adds: tuple[ScoredProposal, ...]
    """Accepted ADDs in write order (descending R_align, ties by candidate id)."""
    updates: tuple[ScoredProposal, ...]
    """Accepted UPDATEs, one per (task_type, target), in target-id order."""


def dedup_key(task_type: str, text: str) -> DedupKey:
    return (task_type, normalise_text(text))


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def intrinsic_rejection(p: ScoredProposal, *, warmup_steps: int, min_chars: int,
                        max_chars: int) -> tuple[Outcome, str] | None:
    """Why `p` is not write-eligible whatever the bank holds (outcome, reason), or None."""
    if p.step <= warmup_steps:
        return "warmup", f"warmup: step {p.step} <= warmup_steps {warmup_steps}"
    if p.op == "no_edit":
        return "rejected", "no_edit: NO_SKILL never writes"
    if not p.r_fmt_ok:
        return "rejected", "format: the proposal did not parse"
    bad = validate_skill_text(p.text, min_chars=min_chars, max_chars=max_chars)
    if bad is not None:
        return "invalid_text", bad
    v = p.verdict
    if v is None:
        return "rejected", "critic_missing: no critic verdict"
    if v.failed:
        return "rejected", f"critic_failed: {v.reason}"
    if not v.op_reasonable:
        return "rejected", f"critic_op: {v.critic} critic judged the op unreasonable ({v.reason})"
    if not v.content_supported:
        return "rejected", f"critic_content: {v.critic} critic judged the content unsupported ({v.reason})"
    if not p.coverage_ok or not _finite(p.r_align) or not _finite(p.delta_plus):
        return "rejected", "unscored: anchor coverage < 0.8 or R_align/delta+ missing"
    assert p.r_align is not None and p.delta_plus is not None
    if p.delta_plus <= 0:
        return "rejected", f"delta_plus: delta+ = {p.delta_plus:.6g} <= 0"
    if p.r_align <= 0:
        return "rejected", f"r_align: R_align = {p.r_align:.6g} <= 0"
    return None


def eligibility(p: ScoredProposal, *, bank: BankView, warmup_steps: int, min_chars: int,
                max_chars: int) -> tuple[Outcome, str] | None:
    """Why `p` is not write-eligible (outcome, reason), or None when it is."""
    bad = intrinsic_rejection(p, warmup_steps=warmup_steps, min_chars=min_chars, max_chars=max_chars)
    if bad is not None:
        return bad
    if p.op == "update":
        if p.target_skill_id is None:
            return "rejected", "no_target: UPDATE without a target skill id"
        target = bank.skills.get(p.target_skill_id)
        if target is None:
            return "rejected", f"unknown_target: skill {p.target_skill_id!r} is not in the bank"
        if target[0] != p.task_type:
            return "rejected", f"target_task_type: skill {p.target_skill_id!r} belongs to {target[0]!r}"
    return None


def _rank(p: ScoredProposal) -> tuple[float, str]:
    assert p.r_align is not None
    return (-p.r_align, p.candidate_id)


def plan_acceptance(proposals: Sequence[ScoredProposal], *, bank: BankView, warmup_steps: int,
                    min_chars: int, max_chars: int) -> AcceptancePlan:
    """Apply S5 to one batch against `bank`; see the module docstring for the rule."""
    outcome: dict[int, tuple[Outcome, str]] = {}
    seen_ids: set[str] = set()
    eligible: list[int] = []
    for i, p in enumerate(proposals):
        if p.candidate_id in seen_ids:
            outcome[i] = ("rejected", f"duplicate_candidate_id: {p.candidate_id!r} appears twice in the batch")
            continue
        seen_ids.add(p.candidate_id)
        bad = eligibility(p, bank=bank, warmup_steps=warmup_steps, min_chars=min_chars, max_chars=max_chars)
        if bad is None:
            eligible.append(i)
        else:
            outcome[i] = bad

    keys = bank.keys()
    winners: dict[tuple[str, str], int] = {}
    for i in sorted((i for i in eligible if proposals[i].op == "update"), key=lambda i: _rank(proposals[i])):
        p = proposals[i]
        group = (p.task_type, p.target_skill_id or "")
        if group in winners:
            best = proposals[winners[group]].candidate_id
            outcome[i] = ("superseded", f"superseded: {best} has higher R_align for target {p.target_skill_id}")
        elif dedup_key(p.task_type, p.text) in keys:
            outcome[i] = ("duplicate", f"duplicate: same text as skill {keys[dedup_key(p.task_type, p.text)]}")
        else:
            winners[group] = i
    updates = [proposals[i] for _, i in sorted(winners.items())]
    taken = set(keys) | {dedup_key(p.task_type, p.text) for p in updates}

    adds: list[ScoredProposal] = []
    for i in sorted((i for i in eligible if proposals[i].op == "add"), key=lambda i: _rank(proposals[i])):
        p = proposals[i]
        key = dedup_key(p.task_type, p.text)
        if key in taken:
            other = keys.get(key, "an earlier proposal of this batch")
            outcome[i] = ("duplicate", f"duplicate: same (task_type, text) as {other}")
        else:
            taken.add(key)
            adds.append(p)
    for i in winners.values():
        outcome[i] = ("accepted", "")
    for p_index in eligible:
        if proposals[p_index].op == "add" and p_index not in outcome:
            outcome[p_index] = ("accepted", "")
    verdicts = tuple(Verdict(p, *outcome[i]) for i, p in enumerate(proposals))
    return AcceptancePlan(verdicts=verdicts, adds=tuple(adds), updates=tuple(updates))
