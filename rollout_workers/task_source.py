"""Episode assignment as workers free up (`rollout.assignment: dynamic`): a worker takes one task
group at a time from a `TaskSource` whenever it has env slots for a whole group, plays it, and
reports it finished (`finish`); the played groups come back as the worker's result. A group stays
on the worker that took it (sticky per episode); the next group goes to whichever worker frees up
first (least-loaded across episodes).

Each unit carries its own seed, so a group's episodes do not depend on which worker plays it.
`ListSource` is the in-process source (tests, a single worker); deploy's Ray queue
(`deploy.dispatch`) is the one a cluster shares.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from envs.types import TaskSpec
from rollout_workers.types import Trajectory


@dataclass(frozen=True)
class TaskUnit:
    """One task group to play: its position in the step's task list, the task, its seed."""

    index: int
    task: TaskSpec
    seed: int


class TaskSource(Protocol):
    def take(self) -> TaskUnit | None:
        """The next group to play; None when there is none left."""
        ...

    def finish(self, unit: TaskUnit) -> None:
        """`unit` has been played (its trajectories come back with the worker's result)."""
        ...


class ListSource:
    """A thread-safe in-process `TaskSource` over a fixed list of units."""

    def __init__(self, units: Sequence[TaskUnit]) -> None:
        self._todo = deque(units)
        self._lock = threading.Lock()
        self.finished: list[int] = []

    def take(self) -> TaskUnit | None:
        with self._lock:
            return self._todo.popleft() if self._todo else None

    def finish(self, unit: TaskUnit) -> None:
        with self._lock:
            self.finished.append(unit.index)


def in_task_order(groups: Mapping[int, Sequence[Trajectory]]) -> list[Trajectory]:
    """Played groups (unit index -> trajectories) as one list, grouped by task in unit order."""
    return [t for i in sorted(groups) for t in groups[i]]
