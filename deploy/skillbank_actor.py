"""The skill bank as the named Ray actor "skillbank" in the run's namespace.

Any other driver inspects it live: `ray.get_actor("skillbank", namespace=<run.name>)`, or
`python -m deploy skills ls --address ADDR --namespace NS`. With `detached=True` the actor (and the
private Redis server it started when no URL is configured) outlives the driver; stop it with
`shutdown_skillbank`. The actor is a threaded actor (max_concurrency) so inspection calls are
served while a commit runs; the store's optimistic transactions keep concurrent writes safe.
`RemoteSkillBank` is the training stage's view of the actor (its read and write calls)."""

from __future__ import annotations

from collections.abc import Sequence

from deploy.logs import actor_runtime_env
from skillbank_service.config import SkillBankConfig
from skillbank_service.service import SkillBankService
from skillbank_service.types import ApplyResult, RetrievedSkill, ScoredProposal

ACTOR_NAME = "skillbank"
MAX_CONCURRENCY = 8


def get_or_create_skillbank(cfg: SkillBankConfig, namespace: str, detached: bool = False, *,
                            num_cpus: float = 0.0):
    """The "skillbank" actor of `namespace`, created from `cfg` if it does not exist yet. The bank's
    Redis keys live under cfg.key_prefix; left at its default it becomes `namespace` (the run name),
    so runs sharing one Redis server never mix."""
    import ray

    if cfg.key_prefix == SkillBankConfig.model_fields["key_prefix"].default:
        cfg = SkillBankConfig.model_validate({**cfg.model_dump(), "key_prefix": namespace})
    options: dict = {"name": ACTOR_NAME, "namespace": namespace, "get_if_exists": True,
                     "num_cpus": num_cpus, "max_concurrency": MAX_CONCURRENCY, "max_restarts": 0}
    if detached:
        options["lifetime"] = "detached"
    if runtime_env := actor_runtime_env({}, ACTOR_NAME):  # RUN/logs/skillbank.log when logs are routed
        options["runtime_env"] = runtime_env
    handle = ray.remote(SkillBankService).options(**options).remote(cfg)
    ray.get(handle.ping.remote())  # surfaces a failed start (no server binary, bad URL) here
    return handle


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


class RemoteSkillBank:
    """The "skillbank" actor as `deploy.stages.uniskill.SkillBank` (retrieve_many / apply), each
    call waiting for the actor's answer."""

    def __init__(self, handle):
        self.handle = handle

    def retrieve_many(self, queries: Sequence[str], k: int | None = None,
                      task_types: Sequence[str | None] | None = None) -> list[list[RetrievedSkill]]:
        import ray

        return ray.get(self.handle.retrieve_many.remote(list(queries), k, task_types))

    def apply(self, proposals: Sequence[ScoredProposal]) -> ApplyResult:
        import ray

        return ray.get(self.handle.apply.remote(list(proposals)))
