"""Waiting on actor calls without hanging, and telling an actor's death from a bug.

Every call the driver makes to the actors (`deploy.cluster.Cluster`) goes through `gather` /
`get_all`, which return when every reference has answered, raise a method's exception as soon
as it arrives and `CallTimeout` when `timeout_s` passes; an actor's death is handed back
(`gather`) for the caller to recover from, or raised (`get_all`). `wait_alive` waits for an actor
that Ray is restarting. The contracts of what was recovered (`Recovery`) and the failure a
learner group cannot continue from (`LearnerGroupFailed`) live here too; what the driver does
about them is in `deploy.cluster` (rollout workers) and `deploy.trainer` (the learner group).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DIED_RETRIES = 3
"""ActorDiedError answers tolerated while waiting for a restart, before the actor counts as gone."""


class CallTimeout(TimeoutError):
    """An actor call did not answer within its timeout (`ray.call_timeout_s`)."""


class LearnerGroupFailed(RuntimeError):
    """A learner rank died or stopped answering: the data-parallel group cannot continue and must
    be replaced as a whole (`deploy.trainer.Trainer.restart_learners`)."""


@dataclass(frozen=True)
class Recovery:
    """One survived failure: which component, how long getting it back took, and facts about
    what the recovery restored (logged as `faults/<key>` on the step it happened)."""

    component: str
    """rollout_worker | learner | env_pool | skillbank_redis | skillbank_actor | driver"""
    name: str
    """The actor (e.g. "rollout_worker_0") or process that failed."""
    seconds: float
    """From noticing the failure to the component serving again."""
    facts: dict[str, float] = field(default_factory=dict)


def is_actor_death(err: BaseException) -> bool:
    """True for errors that mean the actor process is gone or restarting (not a Python exception
    raised by the method, which is a bug and must surface). An actor Ray cannot place again (its
    node left and it was pinned there: ActorUnschedulableError), and a finished call whose result
    was lost with the actor's node (ObjectLostError), count as gone too (`deploy.elastic`)."""
    from ray.exceptions import (
        ActorUnschedulableError,
        ObjectLostError,
        ObjectReconstructionFailedError,
        RayActorError,
    )

    return (isinstance(err, (RayActorError, ActorUnschedulableError, ObjectReconstructionFailedError))
            or type(err) is ObjectLostError)  # not its subclasses for freed objects or fetch timeouts


def gather(refs: Sequence[Any], *, timeout_s: float, what: str, knob: str = "ray.call_timeout_s",
           raise_deaths: bool = False) -> list[tuple[Any, BaseException | None]]:
    """Every ref's (value, None), or (None, error) when its actor died (`is_actor_death`), in
    order. Any other failure is raised as soon as it is ready (not in list order: a dead
    learner rank must not sit behind a survivor blocked in a collective); CallTimeout naming
    `what` and the config key `knob` when not every ref answered within `timeout_s`. Values are
    fetched to the driver: pass small results (weights travel by reference). `raise_deaths`:
    an actor's death is raised as soon as it is ready, too."""
    import ray

    deadline = time.monotonic() + timeout_s
    out: dict[int, tuple[Any, BaseException | None]] = {}
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0.0))
        if not ready:
            raise CallTimeout(f"{what}: {len(pending)} call(s) did not answer within {timeout_s:g}s ({knob}); "
                              "an actor is hung or a collective is waiting for a rank that is gone")
        for ref in ready:
            try:
                out[index[ref]] = (ray.get(ref), None)
            except Exception as err:
                if raise_deaths or not is_actor_death(err):
                    raise
                out[index[ref]] = (None, err)
    return [out[i] for i in range(len(refs))]


def get_all(refs: Sequence[Any], *, timeout_s: float, what: str, knob: str = "ray.call_timeout_s") -> list:
    """The values of `refs`; every failure, an actor's death included, raised as soon as it is
    ready (see `gather`)."""
    return [value for value, _ in gather(refs, timeout_s=timeout_s, what=what, knob=knob, raise_deaths=True)]


def wait_alive(submit: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    """Call `submit()` (an actor method's `.remote()`) until the actor answers: while Ray restarts
    it the call is refused (ActorUnavailableError) and retried with backoff. Raises RuntimeError
    when the actor stays dead (its restarts are used up) and CallTimeout after `timeout_s`."""
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    deadline, delay, died = time.monotonic() + timeout_s, 0.5, 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CallTimeout(f"{what}: the actor was not back within {timeout_s:g}s (ray.call_timeout_s)")
        try:
            return ray.get(submit(), timeout=left)
        except ray.exceptions.GetTimeoutError as err:
            raise CallTimeout(f"{what}: no answer within {timeout_s:g}s (ray.call_timeout_s)") from err
        except ActorUnavailableError:
            pass
        except ActorDiedError as err:
            died += 1
            if died > DIED_RETRIES:
                raise RuntimeError(f"{what}: the actor died and Ray will not restart it again "
                                   "(its restarts, run.max_restarts, are used up)") from err
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(delay * 2, 5.0)
