"""One-step-off rollout pipeline (docs/pipeline.md): with `rollout.max_staleness` K >= 1 the driver
submits the rollout of step k+1 before the learner trains on step k, so the engines generate while
the learner updates. `RolloutPipeline` owns that one in-flight rollout (submit / wait / drain /
discard); the pure rules (when a step may be prefetched, the staleness of a batch) are functions.
With K = 0 every rollout is submitted and waited for at once: the synchronous loop.

The pipeline talks to a `Collector` (`deploy.cluster.Cluster` in a run, a fake in unit tests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envs.types import TaskSpec
from rollout_workers.types import AnyTrajectory, RolloutStats, Trajectory

log = logging.getLogger(__name__)


class Collector(Protocol):
    """Rollouts as submit + wait (`deploy.cluster.Cluster`)."""

    def submit_collect(self, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int,
                       temperature: float, skill_texts: Mapping[str, str | None] | None = None) -> Any:
        """Put the collect calls in the workers' queues; returns a handle for `wait_collect`."""
        ...

    def wait_collect(self, pending: Any) -> tuple[list[AnyTrajectory], RolloutStats]:
        """The episodes (summaries) of a submitted collect (re-running the chunks of a worker that died)."""
        ...

    def wait_finished(self, pending: Any) -> None:
        """Block until the submitted calls have finished (without fetching their results)."""
        ...


class StalenessExceeded(RuntimeError):
    """A batch is older than rollout.max_staleness policy versions (the pipeline's bound broke)."""


def batch_staleness(trajectories: Sequence[AnyTrajectory], learner_version: int) -> tuple[float, int]:
    """(mean, max) over the episodes of `learner_version - t.policy_version`: how many updates the
    learner made since the weights that sampled each episode (the version its engine held)."""
    if not trajectories:
        return 0.0, 0
    ages = [learner_version - t.policy_version for t in trajectories]
    return sum(ages) / len(ages), max(ages)


def check_staleness(trajectories: Sequence[AnyTrajectory], learner_version: int, max_staleness: int,
                    step: int) -> tuple[float, int]:
    """`batch_staleness`, raising StalenessExceeded when the oldest episode is more than
    `max_staleness` versions behind the learner (the schedule makes that impossible: a bug)."""
    mean, worst = batch_staleness(trajectories, learner_version)
    if worst > max_staleness:
        raise StalenessExceeded(
            f"step {step}: an episode sampled by policy version {learner_version - worst} would train the "
            f"learner at version {learner_version}, {worst} versions later, above rollout.max_staleness="
            f"{max_staleness}")
    return mean, worst


def may_prefetch(step: int, *, max_staleness: int, total_steps: int, eval_every: int,
                 checkpoint_every: int) -> bool:
    """Whether the rollout of step+1 may be submitted while step trains: only with K >= 1, not past
    the last step, and never across a step after which an evaluation or a checkpoint happens (so
    those see nothing in flight and a resumed run replays exactly what an uninterrupted one did)."""
    if max_staleness < 1 or step >= total_steps:
        return False
    if eval_every and step % eval_every == 0:
        return False
    return not (checkpoint_every and step % checkpoint_every == 0)


@dataclass
class InFlight:
    """One submitted rollout: its step, the version the driver asked for, and the driver-side
    seconds its submission took (sample, retrieve: logged with its own step)."""

    step: int
    pending: Any
    policy_version: int
    seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    """Metrics known at submission (e.g. uniskill/bank_commit_seen), logged with `step`."""
    submitted_at: float = field(default_factory=time.perf_counter)


@dataclass
class Collected:
    """A finished rollout as the step that trains on it sees it."""

    step: int
    trajectories: list[AnyTrajectory]
    """The episodes' summaries (whole trajectories from a collector that keeps no refs)."""
    stats: RolloutStats
    wait_s: float
    """Seconds the driver (hence the learner) blocked waiting for it."""
    prefetched: bool
    seconds: dict[str, float]
    extra: dict[str, float]
    refs: list[Any] = field(default_factory=list)
    """Where the episodes' summaries and token packs live in the object store (the learners fetch
    them from there, `deploy.step_rows`); empty when the collector keeps none (a fake in tests,
    whose `trajectories` are whole)."""

    def with_tokens(self, episodes: Sequence[AnyTrajectory]) -> list[Trajectory]:
        """`episodes` (of this rollout) whole: their token packs fetched from the object store and
        joined, or as they are when the collector returned whole trajectories."""
        if not self.refs:
            return list(episodes)
        from deploy.step_rows import with_tokens

        return with_tokens(episodes, self.refs)


class RolloutPipeline:
    """Holds at most one rollout in flight. `submit(step, ...)` puts a step's collect in the
    workers' queues; `take(step)` waits for it. Everything else the driver does to the workers
    (weight sync, proposals, evaluation) is submitted after it and so runs after it on each worker
    (Ray runs a plain actor's calls one at a time, in submission order)."""

    def __init__(self, collector: Collector, max_staleness: int):
        self.collector = collector
        self.max_staleness = max_staleness
        self._in_flight: InFlight | None = None

    @property
    def in_flight_step(self) -> int | None:
        return self._in_flight.step if self._in_flight is not None else None

    def submit(self, step: int, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int,
               temperature: float, skill_texts: Mapping[str, str | None] | None,
               seconds: Mapping[str, float] | None = None, extra: Mapping[str, float] | None = None) -> None:
        if self._in_flight is not None:
            raise RuntimeError(f"the rollout of step {self._in_flight.step} is still in flight; take it "
                               f"before submitting step {step}")
        pending = self.collector.submit_collect(tasks, group_size=group_size, policy_version=policy_version,
                                                temperature=temperature, skill_texts=skill_texts)
        self._in_flight = InFlight(step, pending, policy_version, dict(seconds or {}), dict(extra or {}))

    def take(self, step: int, *, prefetched: bool) -> Collected:
        """Wait for the rollout of `step` (which must be the one in flight) and hand it over."""
        job = self._in_flight
        if job is None or job.step != step:
            raise RuntimeError(f"step {step} asks for its rollout but "
                               f"{'none' if job is None else f'step {job.step}'} is in flight")
        start = time.perf_counter()
        try:
            trajectories, stats = self.collector.wait_collect(job.pending)
        finally:
            self._in_flight = None
        refs = job.pending.result_refs() if hasattr(job.pending, "result_refs") else []
        return Collected(step, trajectories, stats, time.perf_counter() - start, prefetched, job.seconds, job.extra,
                         refs)

    def wait_engines(self) -> float:
        """Wait until the in-flight rollout (if any) has finished generating, keeping its results in
        flight; returns the seconds waited. Before a weight sync (so a broadcast never holds the
        learners in a collective while the engines are busy) and before an unscheduled evaluation
        or checkpoint (the drain)."""
        start = time.perf_counter()
        if self._in_flight is not None:
            self.collector.wait_finished(self._in_flight.pending)
        return time.perf_counter() - start

    def discard(self) -> int | None:
        """Forget the in-flight rollout after it has finished (a learner restart rewinds the run, a
        shutdown ends it): returns its step, or None when nothing was in flight."""
        job, self._in_flight = self._in_flight, None
        if job is None:
            return None
        try:
            self.collector.wait_finished(job.pending)
        except Exception as err:  # noqa: BLE001 - the results are dropped either way; a dead worker is restarted later
            log.warning("the discarded rollout of step %d failed while finishing: %s", job.step, err)
        return job.step
