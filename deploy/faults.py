"""Fault injection (for testing: `faults.enabled`, `faults.kill`, `faults.at_step`) and the record
of survived failures that goes to metrics.jsonl (`faults/*`) and RUN/faults.json.

The trainer calls `FaultInjector.stage(name, step)` as each stage of a step starts and the
cluster calls `in_flight(call)` once a call is running on the actors. At `at_step` the injector
kills its component at one moment:

| faults.kill       | armed at stage | killed                                   | who brings it back            |
|-------------------|----------------|------------------------------------------|-------------------------------|
| rollout_worker    | rollout        | rollout_worker_0, while `collect` runs   | Ray + `Cluster._recover_worker` |
| env_pool          | rollout        | env_pool_0, while `collect` runs         | Ray (episodes end env_error)  |
| learner           | learn          | the last learner rank, while `train` runs | `Trainer.restart_learners`    |
| skillbank_redis   | retrieve       | the bank's Redis server, at stage start  | the skill-bank actor          |
| skillbank_actor   | retrieve       | the skill-bank actor, at stage start     | Ray + `RemoteSkillBank`       |
| driver            | rollout        | this process (SIGKILL) while `collect` runs, after a checkpoint | `train --resume` |

A fault fires once per run directory: RUN/faults.json records it, so a resumed run (or a learner
group replaying steps) never injects it again, and the resumed run after a driver kill counts the
resume as the restart. Failures the system survives without injection are counted the same way.
Without `faults.enabled` the injector only keeps that record.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.config import TrainConfig
from deploy.recovery import Recovery, wait_alive

log = logging.getLogger(__name__)

KILL_DELAY_S = 1.0
"""How long a call runs before its component is killed (mid-update; mid-collect: COLLECT_KILL_DELAY_S)."""
COLLECT_KILL_DELAY_S = 0.1
"""A collect of the laptop smoke config can finish within a second on an idle machine, and a kill
that lands after it hits the weight sync instead: the rollout worker dies 0.1 s into its collect."""

TRIGGERS: dict[str, tuple[str, str | None]] = {
    "rollout_worker": ("rollout", "collect"),
    "env_pool": ("rollout", "collect"),
    "learner": ("learn", "train"),
    "skillbank_redis": ("retrieve", None),
    "skillbank_actor": ("retrieve", None),
    "driver": ("rollout", "collect"),
}
"""component -> (stage that arms the fault, in-flight call that fires it; None: fire at the stage)."""

EPISODE_WAIT_S = 30.0
"""Longest wait for an EnvPool to hold a live episode before it is killed anyway."""

RECORD = "faults.json"


# ---- pure bookkeeping ------------------------------------------------------------------------
@dataclass
class FaultLog:
    """Survived failures per step and the restart total. `metrics(step)` gives the step's
    `faults/*` keys once: every step when injection is on, else only steps with a failure."""

    always: bool = False
    restarts: int = 0
    pending: dict[int, list[Recovery]] = field(default_factory=dict)
    kills: dict[int, int] = field(default_factory=dict)

    def add(self, step: int, recoveries: Iterable[Recovery]) -> None:
        for r in recoveries:
            self.pending.setdefault(step, []).append(r)
            self.restarts += 1

    def killed(self, step: int) -> None:
        self.kills[step] = self.kills.get(step, 0) + 1

    def metrics(self, step: int) -> dict[str, float]:
        events, kills = self.pending.pop(step, []), self.kills.pop(step, 0)
        if not (events or kills or self.always):
            return {}
        out = {"faults/restarts": float(len(events))}
        if kills:
            out["faults/killed"] = float(kills)
        if events:
            out["faults/recovery_s"] = sum(r.seconds for r in events)
        for r in events:
            out.update({f"faults/{k}": v for k, v in r.facts.items()})
        return out


def survived_line(component: str, step: int, restarts: int, completed: int, total: int) -> str:
    """The run's last line when a fault was injected."""
    return f"faults survived: {component} at step {step}, restarts {restarts}, steps completed {completed}/{total}"


@dataclass(frozen=True)
class FaultRecord:
    """RUN/faults.json: the injected fault, when it fired, and (once the run finished) its outcome."""

    component: str
    at_step: int
    fired_step: int
    fired_at: float
    restarts: int = 0
    steps_completed: int | None = None
    total_steps: int | None = None

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / (RECORD + ".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        tmp.replace(run_dir / RECORD)

    @classmethod
    def load(cls, run_dir: Path) -> FaultRecord | None:
        path = run_dir / RECORD
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def line(self) -> str:
        return survived_line(self.component, self.fired_step, self.restarts, self.steps_completed or 0,
                             self.total_steps or 0)


# ---- the injector ----------------------------------------------------------------------------
class FaultInjector:
    """Kills `faults.kill` at `faults.at_step` (see the module table) and keeps the `FaultLog`."""

    def __init__(self, cfg: TrainConfig):
        f = cfg.faults
        self.component = f.kill if f.enabled else None
        self.at_step = f.at_step
        self.run_dir = Path(cfg.run.output_dir)
        if self.component is not None and f.at_step > cfg.run.total_steps:
            raise ValueError(f"faults.at_step={f.at_step} is after run.total_steps={cfg.run.total_steps}: "
                             "the fault would never fire")
        self.log = FaultLog(always=f.enabled)
        self.timeout_s = cfg.ray.call_timeout_s
        self.record: FaultRecord | None = FaultRecord.load(self.run_dir) if f.enabled else None
        self._armed: str | None = None
        self._step = 0
        self._resumed_after_kill = self.record is not None and self.record.component == "driver"
        self._cluster: Any = None
        self._bank: Callable[[], Any] = lambda: None
        self._checkpoint: Callable[[], Path] | None = None
        self._has_checkpoint: Callable[[int], bool] = lambda step: False
        self._pending_bank: tuple[str, float] | None = None
        self._prior_restarts = self.record.restarts if self.record is not None else 0

    @property
    def fired(self) -> bool:
        return self.record is not None

    def bind(self, cluster: Any, *, bank: Callable[[], Any], checkpoint: Callable[[], Path],
             has_checkpoint: Callable[[int], bool]) -> None:
        """The run's actors: the cluster (its `on_submit` hook is set), the skill-bank handle
        (a getter: None without UniSkill), and how to checkpoint (before a driver kill)."""
        self._cluster, self._bank, self._checkpoint, self._has_checkpoint = cluster, bank, checkpoint, has_checkpoint
        if self.component is not None:
            cluster.on_submit = self.in_flight

    # ---- hooks ---------------------------------------------------------------------------
    def stage(self, name: str, step: int) -> None:
        """A stage of `step` starts."""
        self._step = step
        if self._resumed_after_kill and self.record is not None:
            self._resumed_after_kill = False  # this run is the driver's restart
            self.log.add(step, [Recovery("driver", "driver", time.time() - self.record.fired_at,
                                         {"resumed_at_step": float(step)})])
        if self.component is None or self.fired or step < self.at_step or name != TRIGGERS[self.component][0]:
            return
        if self.component == "driver" and self._checkpoint is not None and not self._has_checkpoint(step - 1):
            self._checkpoint()  # the resumed run continues from here
        hook = TRIGGERS[self.component][1]
        if hook is None:
            self._fire(step)
        else:
            self._armed = hook

    def in_flight(self, call: str) -> None:
        """A cluster call is running on the actors."""
        if self._armed != call:
            return
        self._armed = None
        time.sleep(min(KILL_DELAY_S, COLLECT_KILL_DELAY_S) if call == "collect" else KILL_DELAY_S)
        self._fire(self._step)

    def step_metrics(self, step: int) -> dict[str, float]:
        """`faults/*` of `step`, with what the cluster recovered from since the last step."""
        self._confirm_bank(step)
        if self._cluster is not None:
            self.log.add(step, self._cluster.drain_recoveries())
        return self.log.metrics(step)

    def finish(self, steps_completed: int, total_steps: int) -> str | None:
        """Record the outcome in RUN/faults.json; the survival line when a fault was injected."""
        if self.record is None:
            return None
        restarts = self._prior_restarts + self.log.restarts
        self.record = FaultRecord(**{**self.record.__dict__, "restarts": restarts,
                                     "steps_completed": steps_completed, "total_steps": total_steps})
        self.record.save(self.run_dir)
        return self.record.line()

    # ---- the kills -----------------------------------------------------------------------
    def _fire(self, step: int) -> None:
        assert self.component is not None
        self.record = FaultRecord(self.component, self.at_step, step, time.time(), restarts=self.log.restarts)
        self.record.save(self.run_dir)
        self.log.killed(step)
        log.warning("fault injection: killing %s at step %d", self.component, step)
        getattr(self, f"_kill_{self.component}")(step)

    def _kill_rollout_worker(self, step: int) -> None:
        import ray

        ray.kill(self._cluster.workers[0], no_restart=False)

    def _kill_env_pool(self, step: int) -> None:
        import ray

        pool = self._cluster.pools[0]
        _wait_mid_episode(pool.handle)
        before = ray.get(pool.handle.__ray_call__.remote(_pid), timeout=self.timeout_s)
        start = time.perf_counter()
        ray.kill(pool.handle, no_restart=False)
        deadline = start + self.timeout_s
        while wait_alive(lambda: pool.handle.__ray_call__.remote(_pid), timeout_s=self.timeout_s,
                         what=f"{pool.name} restart") == before:  # the kill has not landed yet
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{pool.name} was killed but its process is still serving")
            time.sleep(0.1)
        self.log.add(step, [Recovery("env_pool", pool.name, time.perf_counter() - start)])

    def _kill_learner(self, step: int) -> None:
        import ray

        ray.kill(self._cluster.learners[-1], no_restart=True)

    def _kill_skillbank_redis(self, step: int) -> None:
        from deploy import skillbank_actor

        handle = self._require_bank()
        start = time.perf_counter()
        skillbank_actor.crash_skillbank_redis(handle)
        self._pending_bank = ("skillbank_redis", start)

    def _kill_skillbank_actor(self, step: int) -> None:
        from deploy import skillbank_actor

        handle = self._require_bank()
        start = time.perf_counter()
        skillbank_actor.kill_skillbank_actor(handle)
        self._pending_bank = ("skillbank_actor", start)

    def _kill_driver(self, step: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def _require_bank(self) -> Any:
        handle = self._bank()
        if handle is None:
            raise ValueError(f"faults.kill={self.component} needs a run with a skill bank (uniskill.enabled)")
        return handle

    def _confirm_bank(self, step: int) -> None:
        """A skill-bank fault counts as survived once the bank answers again after the step (its
        server restarts as counted by the actor, or the actor itself); the seconds run from the
        kill to that answer, an upper bound."""
        if self._pending_bank is None:
            return
        component, start = self._pending_bank
        self._pending_bank = None
        handle = self._require_bank()
        wait_alive(lambda: handle.ping.remote(), timeout_s=self.timeout_s, what="skill-bank actor")
        restarts = 1
        if component == "skillbank_redis":
            import ray

            restarts = int(ray.get(handle.server_restarts.remote(), timeout=self.timeout_s))
        self.log.add(step, [Recovery(component, "skillbank", time.perf_counter() - start)] * restarts)


def _wait_mid_episode(pool: Any) -> None:
    """Return once slot 0 of the EnvPool actor holds a live episode (its expert has a next
    command: the slot was reset and is being played), so a kill lands mid-episode; for an env
    without an expert, after EPISODE_WAIT_S."""
    import ray

    deadline = time.monotonic() + EPISODE_WAIT_S
    while time.monotonic() < deadline:
        try:
            ray.get(pool.expert_actions.remote([0]), timeout=EPISODE_WAIT_S)
            return
        except ray.exceptions.RayTaskError:  # not reset yet
            time.sleep(0.2)


def _pid(actor: Any) -> int:
    """Runs on an actor (`__ray_call__`): its process id."""
    return os.getpid()
