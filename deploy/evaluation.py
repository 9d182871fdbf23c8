"""Evaluation on a fixed task set: Avg@k (with a task-clustered standard error), Pass@k and
per-task-type success. The summary is pure; running the episodes is the topology's job.

Avg@k = mean success over all k x N episodes (an estimate of pass@1). Its standard error is taken
over tasks (the k samples of one task are not independent): s.e. = std(per-task means) / sqrt(N).
Pass@k = fraction of tasks with at least one success in k samples (n == k, so the unbiased
estimator 1 - C(n-c, k)/C(n, k) reduces to this).

WebShop also reports its score next to them (verl-agent's `webshop_task_score`, as the papers
print it): score = 100 x mean raw task score (the purchase score in [0, 1]; 0 for an episode
without a purchase) over all k x N episodes, with the same task-clustered standard error, overall
and per task type. Success stays `Trajectory.success` = won = (score == 1) for Avg@k / Pass@k.
For envs without a raw score (ALFWorld) the score fields are None; which envs report one is
the env's `reports_task_score` (`rollout_workers.env_profiles`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from rollout_workers.env_profiles import rollout_profile
from rollout_workers.summaries import rep4gram_ratio
from rollout_workers.types import AnyTrajectory


class TypeResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_tasks: int
    avg_at_k: float
    pass_at_k: float
    score: float | None = None
    """WebShop: 100 x mean raw task score of this type's episodes (None for ALFWorld)."""


class EvalResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    split: str
    num_tasks: int
    k: int
    temperature: float
    avg_at_k: float
    avg_at_k_se: float
    pass_at_k: float
    per_task_type: dict[str, TypeResult]
    num_episodes: int
    end_reasons: dict[str, int]
    policy_version: int
    per_task: dict[str, float] = {}
    """task_id -> mean success over its k samples (for paired comparisons)."""
    score: float | None = None
    """WebShop: 100 x mean raw task score over all episodes (None for envs without a raw score)."""
    score_se: float | None = None
    """Standard error of `score`, clustered by task like `avg_at_k_se`."""
    per_task_score: dict[str, float] = {}
    """WebShop: task_id -> 100 x mean raw task score over its k samples ({} without a raw score)."""
    response_len_mean: float | None = None
    """Mean response tokens per turn over all episodes (SMRC-SD's length column; None in older files)."""
    rep4gram_ratio: float | None = None
    """Mean over turns of the response's repeated 4-gram ratio (`envs.health.repeated_ngram_ratio`;
    docs/algorithms.md S8; None in older files)."""


class PairedDifference(BaseModel):
    """after - before on the same tasks: mean of per-task differences and its standard error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: float
    se: float
    num_tasks: int


def paired_difference(before: EvalResult, after: EvalResult) -> PairedDifference:
    """Paired over tasks (the fixed set is the same), so task difficulty cancels out."""
    if set(before.per_task) != set(after.per_task) or not before.per_task:
        raise ValueError("paired_difference needs two evaluations of the same non-empty task set")
    diffs = [after.per_task[t] - before.per_task[t] for t in sorted(before.per_task)]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    return PairedDifference(mean=mean, se=se, num_tasks=n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al.)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _per_task(trajectories: Sequence[AnyTrajectory]) -> dict[str, list[bool]]:
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task.task_id].append(t.success)
    return by_task


def _per_task_score(trajectories: Sequence[AnyTrajectory]) -> dict[str, list[float]] | None:
    """task_id -> raw scores, or None when no trajectory comes from an env with a raw score.
    A WebShop episode without a reported score (e.g. an env error before any step) counts 0."""
    if not any(rollout_profile(t.task.env).reports_task_score or t.task_score is not None for t in trajectories):
        return None
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task.task_id].append(t.task_score or 0.0)
    return by_task


def _mean_and_se(by_task: dict[str, list[bool]] | dict[str, list[float]]) -> tuple[float, float]:
    """Mean over tasks of the per-task means and its task-clustered standard error."""
    means = [sum(s) / len(s) for s in by_task.values()]
    n = len(means)
    if n == 0:
        return 0.0, 0.0
    avg = sum(means) / n
    se = math.sqrt(sum((m - avg) ** 2 for m in means) / (n - 1) / n) if n > 1 else 0.0
    return avg, se


def _avg_and_pass(by_task: dict[str, list[bool]], k: int) -> tuple[float, float, float]:
    if not by_task:
        return 0.0, 0.0, 0.0
    avg, se = _mean_and_se(by_task)
    n = len(by_task)
    passed = sum(pass_at_k(len(s), sum(s), min(k, len(s))) for s in by_task.values()) / n
    return avg, se, passed


def summarize_eval(
    trajectories: Sequence[AnyTrajectory], *, label: str, split: str, k: int, temperature: float
) -> EvalResult:
    """Summarise k samples per task. Every task must appear exactly k times."""
    by_task = _per_task(trajectories)
    bad = {tid: len(s) for tid, s in by_task.items() if len(s) != k}
    if bad:
        raise ValueError(f"expected {k} samples per task, got {bad}")
    avg, se, passed = _avg_and_pass(by_task, k)
    scores = _per_task_score(trajectories)
    score, score_se = _mean_and_se(scores) if scores is not None else (None, None)
    task_type = {t.task.task_id: t.task.task_type for t in trajectories}
    per_type: dict[str, TypeResult] = {}
    for ttype in sorted(set(task_type.values())):
        sub = {tid: s for tid, s in by_task.items() if task_type[tid] == ttype}
        a, _, p = _avg_and_pass(sub, k)
        type_score = None
        if scores is not None:
            type_score = 100.0 * _mean_and_se({tid: scores[tid] for tid in sub})[0]
        per_type[ttype] = TypeResult(num_tasks=len(sub), avg_at_k=a, pass_at_k=p, score=type_score)
    reasons: dict[str, int] = defaultdict(int)
    for t in trajectories:
        reasons[t.end_reason] += 1
    return EvalResult(
        label=label,
        split=split,
        num_tasks=len(by_task),
        k=k,
        temperature=temperature,
        avg_at_k=avg,
        avg_at_k_se=se,
        pass_at_k=passed,
        per_task_type=per_type,
        num_episodes=len(trajectories),
        end_reasons=dict(reasons),
        policy_version=max((t.policy_version for t in trajectories), default=0),
        per_task={tid: sum(s) / len(s) for tid, s in sorted(by_task.items())},
        score=None if score is None else 100.0 * score,
        score_se=None if score_se is None else 100.0 * score_se,
        per_task_score={tid: 100.0 * sum(s) / len(s) for tid, s in sorted((scores or {}).items())},
        **response_health(trajectories),
    )


def response_health(trajectories: Sequence[AnyTrajectory]) -> dict[str, float]:
    """Mean response length (tokens per turn) and mean repeated-4-gram ratio per turn, from the
    exact response token ids the engine sampled; both 0 without turns."""
    turns = [turn for t in trajectories for turn in t.turns]
    n = max(len(turns), 1)
    return {"response_len_mean": sum(x.num_response_tokens for x in turns) / n,
            "rep4gram_ratio": sum(rep4gram_ratio(x) for x in turns) / n}
