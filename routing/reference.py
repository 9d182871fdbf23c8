"""Reference selection for SMRC-SD routing (docs/algorithms.md S2, "Reference source").

Invariants:
- a reference is a successful trajectory of the same task_id;
- a row's own trajectory (same traj_id) is never its reference;
- the current group is preferred (its most recent, i.e. last in order, success); the per-task
  success buffer is the fallback (its most recent success);
- routing does not import rollout_workers: any object with the `RoutableTrajectory` attributes works.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol


class RoutableTrajectory(Protocol):
    """The minimal view of a trajectory that routing needs (read-only attributes)."""

    @property
    def task_id(self) -> str: ...
    @property
    def traj_id(self) -> str: ...
    @property
    def success(self) -> bool: ...
    @property
    def actions(self) -> Sequence[str]: ...
    @property
    def observations(self) -> Sequence[str]: ...


class SuccessBuffer:
    """Per-task FIFO of the latest successful trajectories (at most `per_task` each; failures ignored)."""

    def __init__(self, per_task: int = 4) -> None:
        if per_task < 1:
            raise ValueError(f"per_task must be >= 1, got {per_task}")
        self.per_task = per_task
        self._by_task: dict[str, deque[RoutableTrajectory]] = {}

    def add(self, traj: RoutableTrajectory) -> None:
        if not traj.success:
            return
        q = self._by_task.setdefault(traj.task_id, deque(maxlen=self.per_task))
        for old in [t for t in q if t.traj_id == traj.traj_id]:
            q.remove(old)  # re-adding a trajectory refreshes its recency
        q.append(traj)

    def extend(self, trajs: Iterable[RoutableTrajectory]) -> None:
        for traj in trajs:
            self.add(traj)

    def latest(self, task_id: str, exclude_traj_id: str | None = None) -> RoutableTrajectory | None:
        """Most recent buffered success of `task_id` whose traj_id is not `exclude_traj_id`."""
        for traj in reversed(self._by_task.get(task_id, ())):
            if traj.traj_id != exclude_traj_id:
                return traj
        return None

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_task.values())

    def items(self) -> list[RoutableTrajectory]:
        """Every buffered success, oldest first within each task (re-adding them in this order
        rebuilds the buffer: what a checkpoint stores)."""
        return [t for q in self._by_task.values() for t in q]


def select_reference(
    row: RoutableTrajectory, group: Sequence[RoutableTrajectory], buffer: SuccessBuffer | None = None
) -> RoutableTrajectory | None:
    """The reference for `row`: last success of the same task in `group`, else the buffer's latest."""
    for traj in reversed(group):
        if traj.success and traj.task_id == row.task_id and traj.traj_id != row.traj_id:
            return traj
    if buffer is not None:
        return buffer.latest(row.task_id, exclude_traj_id=row.traj_id)
    return None


def select_references(
    group: Sequence[RoutableTrajectory], buffer: SuccessBuffer | None = None
) -> dict[str, RoutableTrajectory | None]:
    """traj_id -> reference for every row of `group` (call before adding `group` to the buffer)."""
    return {row.traj_id: select_reference(row, group, buffer) for row in group}
