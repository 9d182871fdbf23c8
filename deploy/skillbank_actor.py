"""The skill bank as the named Ray actor "skillbank" in the run's namespace.

Any other driver inspects it live: `ray.get_actor("skillbank", namespace=<run.name>)`, or
`python -m deploy skills ls --address ADDR --namespace NS`. With `detached=True` the actor (and the
private Redis server it started when no URL is configured) outlives the driver; stop it with
`shutdown_skillbank`. The actor is a threaded actor (max_concurrency) so inspection calls are
served while a commit runs; the store's optimistic transactions keep concurrent writes safe.
`RemoteSkillBank` is the training stage's view of the actor (its read and write calls).

Failures: Ray restarts a dead actor (MAX_RESTARTS) and resubmits the calls that were in flight
(max_task_retries); the restarted actor restarts its private server on the same data directory
with the password persisted there, so the AOF brings the bank back, and `apply` is idempotent by
candidate id, so a resubmitted commit never writes twice. A server that dies under a live actor is
restarted (or, for a configured URL, waited for) by the service itself (skillbank_service.recovery).
`crash_skillbank_redis` and `kill_skillbank_actor` are the fault injector's hooks."""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from deploy.logs import actor_runtime_env
from skillbank_service.config import SkillBankConfig
from skillbank_service.service import SkillBankService
from skillbank_service.types import ApplyResult, RetrievedSkill, ScoredProposal

ACTOR_NAME = "skillbank"
MAX_CONCURRENCY = 8
MAX_RESTARTS = 4
"""Restarts Ray grants a dead skill-bank actor (each reloads the bank from its server)."""
UNAVAILABLE_TIMEOUT_S = 300.0
"""How long RemoteSkillBank keeps retrying a call while the actor is restarting."""

log = logging.getLogger(__name__)
T = TypeVar("T")


class SkillBankActor(SkillBankService):
    """The service as Ray hosts it. A restarted incarnation (Ray reruns this constructor with the
    same config) must find the bank it had: its private server's data directory with the persisted
    password, else it refuses to start on an empty bank. Without a configured data_dir the private
    server keeps its data in a temporary directory named after the actor id, which survives the
    actor's restarts on one node and is removed by `shutdown`."""

    def __init__(self, cfg: SkillBankConfig):
        import ray

        ctx = ray.get_runtime_context()
        temporary = False
        if cfg.url is None and cfg.data_dir is None:
            data_dir = Path(tempfile.gettempdir()) / f"skillbank-{ctx.get_actor_id()}"
            cfg, temporary = cfg.model_copy(update={"data_dir": str(data_dir)}), True
        with warnings.catch_warnings():  # Ray's own property trips its actor_id deprecation warning
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = ctx.was_current_actor_reconstructed
        if restarted:
            log.warning("skill-bank actor restarted by Ray: re-attaching to the bank in %s",
                        cfg.url or cfg.data_dir)
        super().__init__(cfg, expect_existing=restarted, temporary_data=temporary)


def skillbank_gpus(cfg: SkillBankConfig) -> float:
    """The GPU share the actor requests: its embedder's device decides (CPU needs none)."""
    return cfg.embedding_gpus if cfg.embedding_device == "cuda" else 0.0


def get_or_create_skillbank(cfg: SkillBankConfig, namespace: str, detached: bool = False, *,
                            num_cpus: float = 0.0):
    """The "skillbank" actor of `namespace`, created from `cfg` if it does not exist yet. The bank's
    Redis keys live under cfg.key_prefix; left at its default it becomes `namespace` (the run name),
    so runs sharing one Redis server never mix. With embedding_device="cuda" the actor holds a GPU
    share (`skillbank_gpus`); a new actor that could not get one fails here, naming the setting."""
    import ray

    if cfg.key_prefix == SkillBankConfig.model_fields["key_prefix"].default:
        cfg = SkillBankConfig.model_validate({**cfg.model_dump(), "key_prefix": namespace})
    gpus = skillbank_gpus(cfg)
    if gpus and not _exists(namespace):
        free = ray.available_resources().get("GPU", 0.0)
        if free + 1e-9 < gpus:
            raise RuntimeError(f"uniskill.bank.embedding_device='cuda' asks for {gpus:g} GPU for the skill-bank "
                               f"actor but the Ray cluster has {free:g} GPU free (after the rollout workers and "
                               "learners); set uniskill.bank.embedding_device=cpu, lower uniskill.bank.embedding_gpus, "
                               "or free a GPU")
    options: dict = {"name": ACTOR_NAME, "namespace": namespace, "get_if_exists": True,
                     "num_cpus": num_cpus, "num_gpus": gpus, "max_concurrency": MAX_CONCURRENCY,
                     "max_restarts": MAX_RESTARTS, "max_task_retries": -1}
    if detached:
        options["lifetime"] = "detached"
    if runtime_env := actor_runtime_env({}, ACTOR_NAME):  # RUN/logs/skillbank.log when logs are routed
        options["runtime_env"] = runtime_env
    handle = ray.remote(SkillBankActor).options(**options).remote(cfg)
    ray.get(handle.ping.remote())  # surfaces a failed start (no server binary, bad URL) here
    return handle


def _exists(namespace: str) -> bool:
    import ray

    try:
        ray.get_actor(ACTOR_NAME, namespace=namespace)
    except ValueError:
        return False
    return True


def get_skillbank(namespace: str):
    """The running actor, or a ValueError naming the namespace when there is none."""
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=namespace)
    except ValueError as err:
        raise ValueError(f"no actor {ACTOR_NAME!r} in Ray namespace {namespace!r}: is a UniSkill run with "
                         f"run.name={namespace!r} active on this cluster?") from err


def shutdown_skillbank(handle) -> None:
    """Stop the actor's private Redis server, then the actor."""
    import ray

    try:
        ray.get(handle.shutdown.remote(), timeout=60)
    finally:
        ray.kill(handle)


# ---- fault injection (deploy.faults) ---------------------------------------------------------


def crash_skillbank_redis(handle) -> None:
    """SIGKILL the bank's private Redis server, as an OOM killer would: no shutdown, no notice to
    the actor, which finds out on its next call and restarts the server from its AOF. A bank on a
    configured URL has no server of its own to kill (ValueError)."""
    import ray

    ray.get(handle.kill_local_server.remote(), timeout=60)


def skillbank_server_restarts(handle) -> int:
    """How often the actor's current incarnation restarted its private server after finding it
    dead (0 for a fresh incarnation, e.g. right after Ray restarted the actor)."""
    import ray

    return int(ray.get(handle.server_restarts.remote(), timeout=60))


def kill_skillbank_actor(handle) -> None:
    """Kill the skill-bank actor's process; Ray restarts it (max_restarts) and resubmits the calls
    that were in flight."""
    import ray

    ray.kill(handle, no_restart=False)


# ---- the training stage's view --------------------------------------------------------------


class RemoteSkillBank:
    """The "skillbank" actor as `deploy.stages.uniskill.SkillBank` (retrieve_many / apply), each
    call waiting for the actor's answer. Ray resubmits a call whose actor died (max_task_retries);
    a call refused while the actor is restarting is retried here until UNAVAILABLE_TIMEOUT_S.
    Both calls are safe to repeat: retrieval reads, and `apply` is idempotent by candidate id."""

    def __init__(self, handle, *, timeout_s: float = UNAVAILABLE_TIMEOUT_S):
        self.handle = handle
        self.timeout_s = timeout_s

    def retrieve_many(self, queries: Sequence[str], k: int | None = None,
                      task_types: Sequence[str | None] | None = None) -> list[list[RetrievedSkill]]:
        return self._call(lambda: self.handle.retrieve_many.remote(list(queries), k, task_types))

    def apply(self, proposals: Sequence[ScoredProposal]) -> ApplyResult:
        return self._call(lambda: self.handle.apply.remote(list(proposals)))

    def _call(self, submit: Callable[[], object]) -> T:
        import ray
        from ray.exceptions import ActorUnavailableError

        deadline, delay = time.monotonic() + self.timeout_s, 0.5
        while True:
            try:
                return ray.get(submit())
            except ActorUnavailableError:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("skill-bank actor unavailable (restarting?): retrying in %.1fs", delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
