"""The driver's side of colocated placement (docs/architecture.md "Placement"): which side holds
the devices, and the in-place weight handover.

`DevicePhases` moves the devices between the two sides of a colocated run; with disaggregated
placement every call is a no-op. Order (the one verl's hybrid engine and OpenRLHF's
`--colocate_all` use: the side that is done releases before the other side takes):

    generate: learner ranks offload their state -> engines wake up (weights, KV cache)
    train:    engines sleep (level 2 when a handover will replace the weights, else level 1)
              -> learner ranks reload their state
    handover: engines wake their weights -> every learner rank starts streaming its weights through
              a two-slot ring -> each engine loads the chunks of the learner ranks on its devices
              -> learner ranks free the ring

Each call is idempotent on both sides, so a phase entered twice, or after a replaced learner
group or a restarted worker, does what is still needed. Every call goes through the cluster's
bounded, recovering calls: a dead worker is restarted and brought to the current weights, a dead
learner rank raises LearnerGroupFailed (`deploy.cluster`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

Holder = Literal["engines", "learner"]


class Cluster(Protocol):
    """What the phases use of `deploy.cluster.Cluster` (which owns a `DevicePhases`)."""

    cfg: Any
    workers: list
    policy_version: int
    weights_digest: str | None

    def _on_learners(self, submit: Callable[[Any], Any], *, what: str) -> list: ...

    def _on_workers(self, jobs: Sequence[tuple[int, Callable[[Any], Any]]], *, what: str) -> list: ...


class DevicePhases:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.enabled = cluster.cfg.ray.placement == "colocated"
        self.holder: Holder | None = None
        """Who holds the devices now (None: both, as at start-up)."""
        self.calls: list[str] = []
        """The phase calls issued, in order (the order test reads it)."""
        self._metrics: dict[str, float] = {}

    def _add(self, key: str, value: float) -> None:
        self._metrics[key] = self._metrics.get(key, 0.0) + value

    def _learners(self, method: str, phase: str) -> None:
        self.calls.append(f"learners.{method}")
        reports = self.cluster._on_learners(lambda lw: getattr(lw, method).remote(), what=method)
        # the ranks' own timing: the first call also waits for the ranks to finish starting up
        self._add(f"colocate/{method.split('_')[0]}_s", max(r["seconds"] for r in reports))
        self._metrics[f"colocate/learner_bytes_{phase}"] = max(r["learner_bytes"] for r in reports)
        used = [r["device_used_bytes"] for r in reports if "device_used_bytes" in r]
        if used:
            self._metrics[f"colocate/device_used_bytes_{phase}"] = max(used)

    def _workers(self, what: str, call, *, timed: bool = True) -> list:
        """`call` on every worker; with `timed` each returns its own seconds (the first call also
        waits for the engines to finish starting up, which is not sleeping or waking)."""
        self.calls.append(f"engines.{what}")
        n = len(self.cluster.workers)
        out = self.cluster._on_workers([(w, call) for w in range(n)], what=what)
        if timed:
            self._add(f"colocate/{what.split('_')[0].rstrip('12')}_s", max(out, default=0.0))
        return out

    def generate(self) -> None:
        """The engines hold the devices: learner state offloaded, engines fully awake."""
        if not self.enabled or self.holder == "engines":
            return
        self._learners("offload_states", "generate")
        self._workers("wake_up", lambda h: h.wake_up.remote(None))
        self.holder = "engines"

    def train(self, *, handover_follows: bool = True) -> None:
        """The learner holds the devices: engines asleep, learner state reloaded."""
        if not self.enabled or self.holder == "learner":
            return
        level = 2 if handover_follows else 1
        self._workers(f"sleep{level}", lambda h: h.sleep.remote(level))
        self._learners("reload_states", "train")
        self.holder = "learner"

    def handover(self, version: int) -> int:
        """Hand the learners' current weights to the engines in place as `version`; returns the
        bytes each engine rank received."""
        cluster, cfg = self.cluster, self.cluster.cfg
        start = time.perf_counter()
        self._workers("wake_weights", lambda h: h.wake_up.remote(["weights"]))
        dtype = None if cfg.engine.dtype == "auto" else cfg.engine.dtype
        self.calls.append("learners.export_handover")
        handovers = cluster._on_learners(
            lambda lw: lw.export_handover.remote(dtype, cfg.sync.bucket_mb, cfg.sync.timeout_s), what="handover export")
        tp = cfg.engine.tensor_parallel_size
        cluster.policy_version, cluster.weights_digest = version, None  # a worker restarted meanwhile loads these
        self._workers("receive_handover",
                      lambda h: h.receive_handover.remote(version, handovers[_index(cluster, h) * tp:][:tp]), timed=False)
        self.calls.append("learners.release_handover")
        cluster._on_learners(lambda lw: lw.release_handover.remote(), what="handover release")
        self._add("colocate/handover_s", time.perf_counter() - start)
        self.holder = None  # the engines' weights are awake beside the learner's state
        return handovers[0].nbytes

    def step_metrics(self) -> dict[str, float]:
        """The per-phase figures since the last call: seconds spent offloading, reloading,
        sleeping, waking and handing over; the learner's device bytes in each phase (and on a GPU
        the whole device's use)."""
        out, self._metrics = self._metrics, {}
        return out


def _index(cluster: Cluster, handle) -> int:
    return next(i for i, h in enumerate(cluster.workers) if h is handle)
