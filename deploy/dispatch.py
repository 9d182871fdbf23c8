"""How a collect's calls reach the rollout workers and come back: a static collect's calls in fixed
chunks (`collect_chunks`, submitted by `deploy.cluster.Cluster.submit_collect`), the calls in flight
(`PendingCalls`) and their merged stats, and dynamic assignment.

`rollout.assignment: dynamic`: a step's task groups in a shared queue that the rollout workers
take from as their env slots free up (`rollout_workers.task_source`), instead of fixed chunks.

- `TaskQueue` (a Ray actor, one per cluster) holds the step's units and which worker took which.
  A worker's call returns the groups it played (so they live in the object store under the call's
  ref, owned by the driver); a worker that dies mid-collect loses the groups it took, which go back
  to the queue.
- `QueueSource` is the worker's `TaskSource` over that actor (pickled into the worker's call).
- `DynamicCollect` is the driver's side: `submit` loads the queue and starts one `collect_units`
  call per worker; `wait` returns the trajectories in task order once every unit is finished. A
  worker that dies mid-collect has its leased groups put back at the front of the queue at once,
  where the surviving workers take them (a survivor gets a new call if it had already finished);
  meanwhile the dead worker is recovered on a thread of its own (`Cluster._recover_worker`: Ray
  restarts it, it reloads the current weights), or removed when its node left; `wait` returns once
  both are done.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from envs.types import TaskSpec
from rollout_workers.engines.base import derive_seed
from rollout_workers.task_source import TaskUnit, in_task_order
from rollout_workers.types import RolloutStats, TrajectorySummary

log = logging.getLogger(__name__)


WorkerJob = tuple[int, Callable[[Any], Any]]
"""(rollout worker index, submit(handle) -> ObjectRef)."""


def merge_stats(stats: Sequence[RolloutStats], wall_s: float) -> RolloutStats:
    return RolloutStats(
        num_episodes=sum(s.num_episodes for s in stats),
        num_turns=sum(s.num_turns for s in stats),
        num_generated_tokens=sum(s.num_generated_tokens for s in stats),
        num_prompt_tokens=sum(s.num_prompt_tokens for s in stats),
        generate_s=sum(s.generate_s for s in stats),
        env_s=sum(s.env_s for s in stats),
        total_s=wall_s,
    )


def collect_chunks(tasks: Sequence[TaskSpec], num_workers: int, per_call: int, *, group_size: int,
                   policy_version: int, temperature: float, skill_texts: Mapping[str, str | None] | None
                   ) -> tuple[list[WorkerJob], dict[Any, Any]]:
    """A static collect's calls in fixed chunks: worker w gets tasks w, w+N, ..., `per_call` tasks a
    call (`RolloutWorker.collect_apart`, two return values); and the dict each submission fills
    with its summaries' ref -> its token pack's ref (re-runs of a dead worker's calls included)."""
    tokens: dict[Any, Any] = {}

    def job(chunk: list[TaskSpec]) -> Callable[[Any], Any]:
        texts = {t.task_id: skill_texts.get(t.task_id) for t in chunk} if skill_texts else None

        def submit(w: Any) -> Any:
            summaries, pack = w.collect_apart.options(num_returns=2).remote(
                chunk, group_size=group_size, policy_version=policy_version, temperature=temperature,
                skill_texts=texts)
            tokens[summaries] = pack
            return summaries
        return submit

    jobs: list[WorkerJob] = []
    for w in range(num_workers):
        share = list(tasks[w::num_workers])
        jobs += [(w, job(share[i : i + per_call])) for i in range(0, len(share), per_call)]
    return jobs, tokens


@dataclass
class PendingCalls:
    """Worker calls in flight: the jobs (to re-run a dead worker's), their refs, and what they are."""

    jobs: list[WorkerJob]
    refs: list[Any]
    what: str
    start: float = field(default_factory=time.perf_counter)
    handles: list[Any] = field(default_factory=list)
    """The worker each job runs on (fixed at submission: indices shift when workers are removed)."""
    stored: dict[int, Any] = field(default_factory=dict)
    """Job index -> the ref its result lives under in the object store (once finished)."""
    tokens: dict[Any, Any] = field(default_factory=dict)
    """A collect's: the ref of each call's summaries -> the ref of its token pack (the call's second
    return value, `RolloutWorker.collect_apart`)."""

    def result_refs(self) -> list[tuple[Any, Any]]:
        """The finished collect calls' (summaries, token pack) refs in job order (what
        `deploy.step_rows.StepRows` hands on)."""
        return [(self.stored[j], self.tokens[self.stored[j]]) for j in sorted(self.stored)]


class TaskQueue:
    """The units of every dynamic collect in flight, by collect id (Ray actor; its calls run one at
    a time). An evaluation may start while a training collect's results still wait to be taken
    (docs/pipeline.md), so each collect has its own queue and its record of who played what."""

    def __init__(self) -> None:
        self._todo: dict[int, deque[TaskUnit]] = {}
        self._held: dict[int, dict[int, tuple[str, TaskUnit]]] = {}

    def load(self, collect: int, units: Sequence[TaskUnit]) -> None:
        self._todo[collect], self._held[collect] = deque(units), {}

    def take(self, collect: int, worker: str) -> TaskUnit | None:
        todo = self._todo.get(collect)
        if not todo:
            return None
        unit = todo.popleft()
        self._held[collect][unit.index] = (worker, unit)
        return unit

    def finish(self, collect: int, worker: str, index: int) -> None:
        """Nothing to record: the group's trajectories come back with the worker's call."""

    def requeue(self, collect: int, worker: str) -> int:
        """`worker`'s call died: every unit it took (played or not: a played group's trajectories
        were to come back with the call) goes back to the front; returns how many."""
        held = self._held.get(collect, {})
        lost = sorted((u for w, u in held.values() if w == worker), key=lambda u: u.index)
        for unit in reversed(lost):
            del held[unit.index]
            self._todo[collect].appendleft(unit)
        return len(lost)

    def pending(self, collect: int) -> int:
        """Units of `collect` nobody has taken yet."""
        return len(self._todo.get(collect, ()))

    def release(self, collect: int) -> None:
        self._todo.pop(collect, None)
        self._held.pop(collect, None)


class QueueSource:
    """A worker's `TaskSource` over collect `collect` of the `TaskQueue` actor `queue`, as worker `name`."""

    def __init__(self, queue: Any, collect: int, name: str) -> None:
        self.queue, self.collect, self.name = queue, collect, name

    def take(self) -> TaskUnit | None:
        import ray

        return ray.get(self.queue.take.remote(self.collect, self.name))

    def finish(self, unit: TaskUnit) -> None:
        pass  # the queue needs no word: the group returns with the call (`TaskQueue.requeue` on its death)


@dataclass
class DynamicPending:
    """A dynamic collect in flight: the call each worker runs (ref -> worker handle)."""

    collect: int
    calls: dict[Any, Any]
    args: dict[str, Any]
    units: int
    start: float = field(default_factory=time.perf_counter)
    stats: list[RolloutStats] = field(default_factory=list)
    groups: dict[int, list[TrajectorySummary]] = field(default_factory=dict)
    recovering: list[tuple[Any, Future]] = field(default_factory=list)
    """(worker, its recovery) for the workers that died, recovering while the collect goes on."""
    killed: int = 0
    requeued: int = 0
    tokens: dict[Any, Any] = field(default_factory=dict)
    """The ref of each call's summaries -> the ref of its token pack."""
    stored: list[tuple[Any, Any]] = field(default_factory=list)
    """The (summaries, token pack) refs of the calls that returned: the first holds
    ({unit index: summaries}, stats)."""

    def result_refs(self) -> list[tuple[Any, Any]]:
        """Where the step's groups live in the object store (`deploy.step_rows.unpack` orders them)."""
        return list(self.stored)


class DynamicCollect:
    """The driver's side of dynamic assignment for one `deploy.cluster.Cluster`."""

    def __init__(self, cluster: Any) -> None:
        import ray

        self.cluster = cluster
        self.queue = ray.remote(TaskQueue).options(num_cpus=0).remote()
        self._collects = 0
        self._recovery = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-recovery")

    def _call(self, pending: DynamicPending, handle: Any) -> None:
        source = QueueSource(self.queue, pending.collect, f"worker-{id(handle):x}")
        summaries, pack = handle.collect_units_apart.options(num_returns=2).remote(source, **pending.args)
        pending.calls[summaries], pending.tokens[summaries] = handle, pack

    def submit(self, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int, temperature: float,
               skill_texts: Mapping[str, str | None] | None = None) -> DynamicPending:
        import ray

        collect, self._collects = self._collects, self._collects + 1
        seed = derive_seed(self.cluster.cfg.rollout.seed, policy_version, collect)
        units = [TaskUnit(i, t, derive_seed(seed, i)) for i, t in enumerate(tasks)]
        ray.get(self.queue.load.remote(collect, units))
        texts = {t.task_id: skill_texts.get(t.task_id) for t in tasks} if skill_texts else None
        args = {"group_size": group_size, "policy_version": policy_version, "temperature": temperature,
                "skill_texts": texts}
        pending = DynamicPending(collect, {}, args, len(units))
        for handle in self.cluster.workers:
            self._call(pending, handle)
        return pending

    def add_worker(self, pending: DynamicPending, handle: Any) -> None:
        """A worker that joined mid-collect starts taking groups at once."""
        self._call(pending, handle)

    def wait_finished(self, pending: DynamicPending) -> None:
        """Until every unit is in (workers that died meanwhile have their groups re-played)."""
        import ray

        from deploy.recovery import CallTimeout

        deadline = time.monotonic() + self.cluster.cfg.ray.call_timeout_s
        while pending.calls:
            ready, _ = ray.wait(list(pending.calls), num_returns=1, timeout=1.0)
            if not ready:
                if time.monotonic() > deadline:
                    raise CallTimeout(f"rollout collect: {len(pending.calls)} worker call(s) unanswered after "
                                      f"ray.call_timeout_s={self.cluster.cfg.ray.call_timeout_s}")
                self._rejoin(pending)
                continue
            self._collected(pending, ready[0])
            self._rejoin(pending)
            if not pending.calls and ray.get(self.queue.pending.remote(pending.collect)):
                alive = [h for h in self.cluster.workers if not any(h is d for d, _ in pending.recovering)]
                if not alive:
                    raise RuntimeError("every rollout worker died during the collect")
                for h in alive:
                    self.add_worker(pending, h)
        recovering, pending.recovering = pending.recovering, []
        for _, future in recovering:
            future.result()

    def _collected(self, pending: DynamicPending, ref: Any) -> None:
        """A worker's call answered: keep its groups, or (its process died) requeue what it took and
        start its recovery."""
        import ray

        from deploy.recovery import is_actor_death

        handle = pending.calls.pop(ref)
        try:
            groups, stats = ray.get(ref)
        except Exception as err:
            if not is_actor_death(err):
                raise
            lost = ray.get(self.queue.requeue.remote(pending.collect, f"worker-{id(handle):x}"))
            pending.killed += 1
            pending.requeued += lost
            pending.recovering.append((handle, self._recovery.submit(self._recover_one, handle)))
            log.warning("a rollout worker died mid-collect (%s); its %d group(s) go back to the queue",
                        type(err).__name__, lost)
            return
        pending.groups.update(groups)
        pending.stats.append(stats)
        pending.stored.append((ref, pending.tokens[ref]))

    def _rejoin(self, pending: DynamicPending) -> None:
        """A worker recovered while groups are still untaken takes them too."""
        import ray

        done = [(h, f) for h, f in pending.recovering if f.done() and f.exception() is None]
        if not done or not ray.get(self.queue.pending.remote(pending.collect)):
            return
        for handle, future in done:
            pending.recovering.remove((handle, future))
            if self.cluster._worker_index(handle) is not None:
                self.add_worker(pending, handle)

    def _recover_one(self, handle: Any) -> None:
        """Bring a worker that died back (or remove it when its node left), on the recovery thread,
        while the survivors play its groups."""
        w = self.cluster._worker_index(handle)
        if w is None:
            return
        if self.cluster._worker_lost(w):
            self.cluster.remove_workers([w], reason="its node left during collect", lost_calls={w: 1})
        else:
            self.cluster._recover_worker(w, RuntimeError("died mid-collect"), lost_calls=1, what="collect")

    def wait(self, pending: DynamicPending) -> tuple[list[TrajectorySummary], RolloutStats]:
        """The step's episode summaries, grouped by task in task order, and the merged stats."""
        import ray

        self.wait_finished(pending)
        ray.get(self.queue.release.remote(pending.collect))
        if sorted(pending.groups) != list(range(pending.units)):
            raise RuntimeError(f"dynamic collect ended with {len(pending.groups)} of {pending.units} groups")
        return in_task_order(pending.groups), merge_stats(pending.stats, time.perf_counter() - pending.start)
