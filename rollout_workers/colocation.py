"""A rollout worker's side of colocated placement (docs/architecture.md "Placement"): its engine
sleeps while the learner rank on the same device trains, wakes for the weight handover and for
generation, and loads the handed-over weights in place (`weightsync.ipc`).

The engine guard (`rollout_workers.worker.EngineGuard`) extends to the phases: sleeping, waking and
loading are updates (they wait until no generating call runs, and generating calls wait for
them), and a generating call that finds the engine asleep is refused with `EngineAsleep` instead
of reaching an engine whose memory the learner holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rollout_workers.worker import RolloutWorker
from weightsync.ipc import Handover

ENGINE_TAGS = ("weights", "kv_cache")
"""What a sleeping engine gives up (vLLM's sleep-mode tags)."""


class EngineAsleep(RuntimeError):
    """A generating call reached an engine asleep: the learner holds the device (a driver bug)."""


class ColocatedWorker:
    """Mixin for `rollout_workers.worker.RolloutWorker` (uses its `_engine`, `_guarded`,
    `_version`, `_calls`, `_digest`)."""

    _asleep: frozenset[str] = frozenset()
    """The tags still asleep (empty: fully awake)."""

    @contextmanager
    def _guarded(self, call: str, *, update: bool = False) -> Iterator[None]:
        with super()._guarded(call, update=update):
            if not update and self._asleep:
                raise EngineAsleep(f"{call} reached the engine while it sleeps ({', '.join(sorted(self._asleep))} "
                                   "released): the learner holds the device; the driver must wake the engine first")
            yield

    def sleep(self, level: int) -> float:
        """Release the device to the learner: level 1 keeps the weights (in host memory), level 2
        discards them (a handover replaces them next). Waits for generating calls to finish;
        returns the seconds the engine took."""
        with self._guarded(f"sleep{level}", update=True):
            start = time.perf_counter()
            if not self._asleep:
                self._engine.sleep(level)
                self._asleep = frozenset(ENGINE_TAGS)
            return time.perf_counter() - start

    def wake_up(self, tags: Sequence[str] | None = None) -> float:
        """Take the device back for `tags` (None: everything); returns the seconds it took."""
        wanted = frozenset(ENGINE_TAGS if tags is None else tags) & self._asleep
        with self._guarded("wake_" + "+".join(sorted(wanted)) if wanted else "wake", update=True):
            start = time.perf_counter()
            if wanted:
                self._engine.wake_up(sorted(wanted))
                self._asleep = self._asleep - wanted
            return time.perf_counter() - start

    def asleep(self) -> list[str]:
        return sorted(self._asleep)

    def receive_handover(self, version: int, handovers: Sequence[Handover]) -> int:
        """Load the weights the learner ranks on this engine's devices exported (handovers[j]: for
        engine rank j) as policy `version`; returns the number of tensors loaded. The engine's
        weights must be awake; its return is the learner's signal to free the buckets."""
        if "weights" in self._asleep:
            self.wake_up(["weights"])
        with self._guarded("receive_handover", update=True):
            count = self._engine.receive_handover(list(handovers))
            if version != self._version:
                self._calls = 0
            self._version, self._digest = version, None
            return count


class ColocatedRolloutWorker(ColocatedWorker, RolloutWorker):
    """The rollout worker of a colocated run (`deploy.topology` starts it in place of RolloutWorker)."""
