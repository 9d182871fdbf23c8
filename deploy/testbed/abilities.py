"""`deploy testbed abilities`: the in-context abilities of a cold-started model, measured on held-out
tasks before any RL. This module owns the teacher figure; the skill and
proposer figures are `deploy.testbed.skill_abilities`'s.

Teacher context gain (the fixed-state teacher intervention of `deploy.analysis.teacher_intervention`,
on states built here instead of archived runs). States: every turn of a detoured-expert episode of
each held-out task (`deploy.testbed.teacher_data`: the student side), routed onto the task's plain
expert episode (the reference) with `method.matcher`. For state i with correct action a*_i,

    Delta_i = l(a*_i | SMRC-SD teacher prompt) - l(a*_i | student prompt)

where l is the token-mean log-prob of "<action>{a*}</action>" + EOS (the analysis's `_Scorer`), the
teacher prompt is SMRC-SD's (full_reference + state_summary + candidate_action, rendered by
`TeacherRouter._teacher_prompt`) and the student prompt is the same turn without a block. As in the
analysis, a* is the reference's candidate action on matched states and the expert's action at the
state on mismatched ones. The figure is

    X = mean_{matched i} Delta_i - mean_{mismatched i} Delta_i

with the analysis's unpaired percentile bootstrap (B = 10,000; different states in the two groups).
X > 0: the model gains more from the block where the block holds the answer than where it does not.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from deploy.analysis.stats import bootstrap_ci, unpaired_bootstrap_ci
from deploy.analysis.teacher_intervention import _Scorer
from deploy.config import TrainConfig
from deploy.testbed.teacher_data import followed_states, make_router, task_pair
from deploy.testbed.types import AbilityFigure
from envs.registry import make_env
from envs.types import TaskSpec
from routing.matching import route


@dataclass(frozen=True)
class TeacherGainDetail:
    figure: AbilityFigure
    matched: tuple[float, ...]
    """Delta of every matched state."""
    mismatched: tuple[float, ...]
    """Delta of every mismatched state."""
    tasks_used: int
    student_matched: tuple[float, ...] = ()
    """l(a*|student prompt) of every matched state (the headroom: Delta cannot exceed -l much)."""
    student_mismatched: tuple[float, ...] = ()
    """l(a*|student prompt) of every mismatched state."""
    copy: tuple[float, ...] = ()
    """Delta of the candidate on every followed state (roles swapped: the plain expert as the student,
    the detoured winner as the reference; matched states whose candidate is a detour, not the
    expert's action): how far the block moves the model towards a candidate it would not pick."""

    def to_json(self) -> dict:
        """Strict JSON: a group with no states (or a figure with none) has null mean/lo/hi, not NaN."""

        def stat(mean: float, lo: float, hi: float, n: int) -> dict:
            finite = n > 0 and all(math.isfinite(x) for x in (mean, lo, hi))
            return {"mean": mean, "lo": lo, "hi": hi, "n": n} if finite else {"mean": None, "lo": None, "hi": None, "n": n}

        def group(values: tuple[float, ...], seed: int = 0) -> dict:
            return stat(*bootstrap_ci(values, seed=seed), len(values))

        f = self.figure
        return {**stat(f.mean, f.lo, f.hi, f.n), "tasks_used": self.tasks_used,
                "delta_matched": group(self.matched), "delta_mismatched": group(self.mismatched),
                "student_logp_matched": group(self.student_matched),
                "student_logp_mismatched": group(self.student_mismatched),
                "copy_gain_followed_states": group(self.copy),
                "definition": "mean Delta(matched) - mean Delta(mismatched), Delta = l(a*|SMRC-SD teacher prompt) "
                              "- l(a*|student prompt), token-mean log-prob; unpaired bootstrap 95% CI"}


def teacher_gain_detail(cfg: TrainConfig, model_dir: str, tasks: list[TaskSpec], *, seed: int,
                        batch_size: int = 8) -> TeacherGainDetail:
    scorer = _Scorer(model_dir, batch_size=batch_size)
    router = make_router(cfg, scorer.tokenizer)
    rng = random.Random(seed)
    env = make_env(cfg.env)
    pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    groups: list[bool] = []
    copy_pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    used = 0
    try:
        for task in tasks:
            pair = task_pair(env, task, None, rng)
            if pair is None:
                continue
            used += 1
            trace = pair.student.trace()
            for t, d in enumerate(route(cfg.method.matcher, trace, pair.reference.trace())):
                action = d.candidate_action if d.matched and d.candidate_action else pair.labels[t]
                response = scorer.response_ids(action)
                student = tuple(router._render(pair.student, t, ""))
                teacher = tuple(router._teacher_prompt(pair.student, t, pair.reference, d, trace))
                pairs.extend([(student, response), (teacher, response)])
                groups.append(d.matched)
            copy_pairs.extend(_followed_pairs(router, scorer, pair, cfg.method.matcher))
    finally:
        env.close()
    if not groups:
        raise ValueError(f"no held-out task of {len(tasks)} gave a student/reference pair (no detoured expert "
                         "attempt won): use more --tasks")
    values = scorer.score(pairs)
    deltas = [values[2 * i + 1] - values[2 * i] for i in range(len(groups))]
    students = [values[2 * i] for i in range(len(groups))]

    def split(xs: list[float], want: bool) -> tuple[float, ...]:
        return tuple(x for x, g in zip(xs, groups, strict=True) if g == want)

    matched, mismatched = split(deltas, True), split(deltas, False)
    mean, lo, hi = unpaired_bootstrap_ci(matched, mismatched, seed=seed)
    figure = AbilityFigure(mean=mean, lo=lo, hi=hi, n=len(deltas), per_item=matched + mismatched)
    copied = scorer.score(copy_pairs)
    copy = tuple(copied[2 * i + 1] - copied[2 * i] for i in range(len(copy_pairs) // 2))
    return TeacherGainDetail(figure, matched, mismatched, used, split(students, True), split(students, False), copy)


def _followed_pairs(router, scorer, pair, matcher: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(student prompt, candidate), (teacher prompt, candidate) of every followed state of `pair`
    (`deploy.testbed.teacher_data.followed_turns`' states)."""
    f = followed_states(pair, matcher)
    out = []
    for t, d in f.states:
        response = scorer.response_ids(d.candidate_action)
        out.extend([(tuple(router._render(f.student, t, "")), response),
                    (tuple(router._teacher_prompt(f.student, t, f.reference, d, f.trace)), response)])
    return out


def teacher_gain(cfg: TrainConfig, model_dir: str, tasks: list[TaskSpec], *, seed: int) -> AbilityFigure:
    """X above; `per_item` holds the matched states' Deltas, then the mismatched states'."""
    return teacher_gain_detail(cfg, model_dir, tasks, seed=seed).figure


def signed(figure: AbilityFigure) -> str:
    """'+0.123 [-0.045, +0.301]'."""
    return f"{figure.mean:+.3f} [{figure.lo:+.3f}, {figure.hi:+.3f}]"


def ability_lines(teacher: AbilityFigure, skill: AbilityFigure, proposer: AbilityFigure) -> list[str]:
    """The three lines `testbed abilities` prints (proposer: `mean` is a fraction in [0, 1])."""
    return [f"teacher context gain matched - mismatched: {signed(teacher)}",
            f"skill gain helpful - irrelevant: {signed(skill)}",
            f"proposer valid skills: {100 * proposer.mean:.1f}%"]
