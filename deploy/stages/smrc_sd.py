"""Training methods as config switches (docs/algorithms.md S2/S8): which turns get a teacher and what
the teacher sees. This is the trainer's step 3 ("route"); the learner then scores the student's
exact response ids under each teacher prompt and adds the routed distillation loss.

| method        | turns distilled                         | teacher context parts (default)        |
|---------------|-----------------------------------------|----------------------------------------|
| grpo          | none                                    | -                                      |
| fullpath_sd   | every turn (with a reference)           | full_reference                         |
| smrc_sd       | turns whose state matches the reference | full_reference, state_summary, candidate_action |
| routing_only  | matched turns                           | full_reference                         |
| context_only  | every turn                              | full_reference, state_summary, candidate_action (where matched) |
| random_turn   | as many turns as routing would pick, uniformly at random | full_reference        |
| skill_sd      | every turn (with a skill)               | skill (Skill-SD loss: rkl)             |
| sdar          | every turn (with a skill)               | skill (SDAR loss: sigmoid-gated)       |

skill_sd / sdar (the SMRC-SD paper's skill-teacher baselines): the teacher sees a skill condensed
from earlier experience of the task (`routing.skills`: the reference's workflow plus the actions
the env rejected in the group's other failed attempts) instead of a reference block; no routing.

`method.candidate` picks which reference visit of a matched state the candidate (and the matched
position) comes from: first visit, last visit, or the loop-erased reference (`routing.matching`).

`method.context_parts` overrides the parts (the paper's "candidate only" / "state summary only"
ablations). A trajectory with no reference (no other success of its task in the group or the
per-task buffer) gets no teacher. References never include the row's own trajectory.

Per env (`task.env`), through `rollout_workers.episode.Episode`: the state tracker that stamps
signatures and summarises the state (`routing.trackers`), the prompt renderer (the loop's, so a
teacher prompt is the student's plus the block) and the reference observations as prompts show
them (`rollout_workers.env_profiles`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollout_workers.config import RolloutConfig
from rollout_workers.episode import Episode
from rollout_workers.prompts import render_prompt_ids, render_prompts
from rollout_workers.summaries import trajectory_from_json
from rollout_workers.turn_messages import recorded_turn_message
from rollout_workers.types import AnyTrajectory
from routing.matching import DEFAULT_CANDIDATE, CandidateRule, RouteTrace, route
from routing.reference import SuccessBuffer, select_references
from routing.skills import build_skill_context, collect_mistakes, condense_workflow
from routing.teacher_context import ContextPart, build_teacher_context
from routing.types import RouteDecision

MethodName = Literal["grpo", "fullpath_sd", "smrc_sd", "routing_only", "context_only", "random_turn", "skill_sd",
                     "sdar"]
TurnRule = Literal["all", "matched", "random"]

RULES: dict[str, tuple[TurnRule, frozenset[ContextPart]]] = {
    "fullpath_sd": ("all", frozenset({"full_reference"})),
    "smrc_sd": ("matched", frozenset({"full_reference", "state_summary", "candidate_action"})),
    "routing_only": ("matched", frozenset({"full_reference"})),
    "context_only": ("all", frozenset({"full_reference", "state_summary", "candidate_action"})),
    "random_turn": ("random", frozenset({"full_reference"})),
    "skill_sd": ("all", frozenset()),
    "sdar": ("all", frozenset()),
}
SKILL_METHODS = frozenset({"skill_sd", "sdar"})
"""Methods whose teacher sees a condensed skill (`routing.skills`) instead of reference parts."""


def skill_block(ep: Episode, ref: Episode, group: Sequence[Episode], *, max_chars: int) -> str:
    """The skill teacher block of `ep`: the workflow of its reference `ref` and the actions the env
    rejected in the group's failed trajectories other than `ep` itself."""
    def steps(e: Episode) -> list[tuple[str, bool]]:
        return [(t.env_action, t.action_valid) for t in e.traj.turns]

    failed = [steps(o) for o in group if not o.success and o.traj_id != ep.traj_id]
    return build_skill_context(condense_workflow(steps(ref)), collect_mistakes(failed), max_chars=max_chars)


def with_references(trajectories: Sequence[AnyTrajectory], buffer: SuccessBuffer) -> Iterator[tuple[Episode, Episode | None]]:
    """Each trajectory with turns, paired with its reference (None: no other success of its task in
    the group or the buffer), group by group; a group's successes join `buffer` after the group.
    The trainer's rule, shared by the analysis tools so that they audit what training did."""
    groups: dict[str, list[Episode]] = {}
    for traj in trajectories:
        if traj.turns:
            groups.setdefault(traj.group_id, []).append(Episode(traj))
    for group in groups.values():
        refs = select_references(group, buffer)
        for ep in group:
            yield ep, refs[ep.traj_id]
        buffer.extend(ep for ep in group if ep.success)


@dataclass
class RoutingResult:
    teacher_messages: dict[tuple[str, int], str] = field(default_factory=dict)
    """(traj_id, turn) -> the teacher's user message of that turn: the student's prompt text with the
    training-only block. Rendered to ids where the rows are built (`render_prompts`): on the
    learner ranks, or on the driver for UniSkill's driver-side rows."""
    metrics: dict[str, float] = field(default_factory=dict)
    tokenizer: Any = field(default=None, repr=False, compare=False)

    @property
    def teacher_prompts(self) -> dict[tuple[str, int], list[int]]:
        """The teacher prompts' ids, rendered here with the router's tokenizer."""
        return render_prompts(self.tokenizer, self.teacher_messages)


def choose_turns(rule: TurnRule, decisions: Sequence[RouteDecision], rng: random.Random) -> list[int]:
    """Turn indices to distil: all, the matched ones, or as many as matched chosen at random."""
    matched = [t for t, d in enumerate(decisions) if d.matched]
    match rule:
        case "all":
            return list(range(len(decisions)))
        case "matched":
            return matched
        case "random":
            return sorted(rng.sample(range(len(decisions)), len(matched)))


class TeacherRouter:
    """Per step: references, per-turn routing decisions, teacher prompts for the chosen turns."""

    def __init__(self, *, method: MethodName, matcher: str, parts: frozenset[ContextPart] | None,
                 audit_matchers: Sequence[str], rollout: RolloutConfig, tokenizer, max_chars: int, seed: int,
                 candidate: CandidateRule = DEFAULT_CANDIDATE):
        self.rule, default_parts = RULES[method]
        self.candidate = candidate
        self.skill = method in SKILL_METHODS
        self.parts = parts if parts is not None else default_parts
        self.matcher, self.audit = matcher, tuple(dict.fromkeys([matcher, *audit_matchers]))
        self.rollout, self.tokenizer, self.max_chars, self.seed = rollout, tokenizer, max_chars, seed
        self.buffer = SuccessBuffer()

    def save(self, path: Path) -> None:
        """The success buffer (references for later steps) as JSONL: part of a checkpoint. Its
        episodes are the summaries the driver routed on (whole trajectories in older checkpoints:
        both load)."""
        path.write_text("".join(ep.traj.model_dump_json() + "\n" for ep in self.buffer.items()))

    def load(self, path: Path) -> None:
        self.buffer = SuccessBuffer(self.buffer.per_task)
        if path.exists():
            # split on "\n" only: str.splitlines() also breaks at U+2028 / U+0085, which JSON leaves unescaped
            lines = [line for line in path.read_text().split("\n") if line.strip()]
            self.buffer.extend(Episode(trajectory_from_json(line)) for line in lines)

    def __call__(self, trajectories: Sequence[AnyTrajectory], *, step: int) -> RoutingResult:
        rng = random.Random(self.seed * 1_000_003 + step)
        result, counts = RoutingResult(tokenizer=self.tokenizer), {f"route/coverage_{m}": 0 for m in self.audit}
        with_reference = total_turns = 0
        groups: dict[str, list[Episode]] = {}
        for traj in trajectories if self.skill else ():
            if traj.turns:
                groups.setdefault(traj.group_id, []).append(Episode(traj))
        for ep, ref in with_references(trajectories, self.buffer):
            total_turns += len(ep.traj.turns)
            if ref is None:
                continue
            with_reference += len(ep.traj.turns)
            student, reference = ep.trace(), ref.trace()
            decisions = {m: route(m, student, reference, self.candidate) for m in self.audit}
            for m, ds in decisions.items():
                counts[f"route/coverage_{m}"] += sum(d.matched for d in ds)
            if self.skill:
                block = skill_block(ep, ref, groups[ep.group_id], max_chars=self.max_chars)
                for t in range(len(ep.traj.turns)) if block else ():  # no workflow to condense: no teacher
                    result.teacher_messages[(ep.traj_id, t)] = self._message(ep, t, block)
                continue
            for t in choose_turns(self.rule, decisions[self.matcher], rng):
                result.teacher_messages[(ep.traj_id, t)] = self._teacher_message(ep, t, ref, decisions[self.matcher][t], student)
        n = max(total_turns, 1)
        result.metrics = {**{k: v / n for k, v in counts.items()}, "route/turns_with_reference": with_reference / n,
                          "route/teacher_rows": len(result.teacher_messages) / n}
        return result

    def _teacher_message(self, ep: Episode, t: int, ref: Episode, decision: RouteDecision, student: RouteTrace) -> str:
        """The student's turn-t message with the training-only block before the observation."""
        block = build_teacher_context(
            parts=self.parts, reference_observations=ref.shown_observations(), reference_actions=ref.actions,
            state_fields=ep.state_fields(t, student), candidate_action=decision.candidate_action,
            max_chars=self.max_chars)
        return self._message(ep, t, block)

    def _teacher_prompt(self, ep: Episode, t: int, ref: Episode, decision: RouteDecision, student: RouteTrace) -> list[int]:
        """`_teacher_message` rendered to ids (the analysis tools' and testbed's view)."""
        return render_prompt_ids(self.tokenizer, self._teacher_message(ep, t, ref, decision, student))

    def _render(self, ep: Episode, t: int, block: str) -> list[int]:
        return render_prompt_ids(self.tokenizer, self._message(ep, t, block))

    def _message(self, ep: Episode, t: int, block: str) -> str:
        return recorded_turn_message(ep.traj, t, self.rollout, skill_text=ep.traj.skill_text,
                                     teacher_context=block or None)
