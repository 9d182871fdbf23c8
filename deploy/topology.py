"""The Ray topology of docs/architecture.md: EnvPool actors, RolloutWorker actors (scaling with
`rollout.num_workers`), Learner actors (DeepSpeed ranks). Resources come from the config.

The same code runs on a laptop (`ray.init` on loopback) and under `ray job submit` (the driver
joins the cluster the job runs on).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from deploy import logs
from deploy.config import TrainConfig

log = logging.getLogger(__name__)

# Deployment facts every actor needs; hyperparameters never travel this way.
WORKER_ENV = {
    "DS_ACCELERATOR": "cpu",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


PLACEMENT_TIMEOUT_S = 120


def _required_cpus(cfg: TrainConfig, with_learner: bool) -> float:
    r = cfg.ray
    need = r.env_pools * r.env_pool_cpus + cfg.rollout.num_workers * r.rollout_cpus
    return need + (r.num_learners * r.learner_cpus if with_learner else 0.0)


def init_ray(cfg: TrainConfig) -> None:
    """Start or join Ray. Locally it binds loopback and reserves enough logical CPUs for the
    whole topology (learners included, so an evaluation-only start can be followed by training)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read when ray is imported
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        return
    logs.divert_framework_handlers()  # Ray's driver logger exists now; ray.init logs through it
    joining = cfg.ray.address is not None or "RAY_ADDRESS" in os.environ
    kwargs: dict = {"namespace": cfg.ray.namespace or cfg.run.name, "log_to_driver": True}
    if joining:
        kwargs["address"] = cfg.ray.address
    else:
        from deploy.reaper import start_reaper

        start_reaper()  # the local cluster and what it starts go when this driver goes, even on SIGKILL
        cores = cfg.ray.num_cpus or os.cpu_count() or 1
        # Logical CPUs: phases run one after another, so oversubscribing cores is intended.
        kwargs.update(num_cpus=max(cores, math.ceil(_required_cpus(cfg, with_learner=True))),
                      include_dashboard=False)
    # No job-level runtime_env here: under `ray job submit` the job's own (working_dir, env) stays.
    ray.init(**kwargs)


def check_resources(cfg: TrainConfig, *, with_learner: bool) -> None:
    """Fail fast, naming the knobs, when the actors could never all be scheduled (Ray would
    otherwise leave them pending forever)."""
    import ray

    r = cfg.ray
    wants = {"CPU": _required_cpus(cfg, with_learner),
             "GPU": cfg.rollout.num_workers * r.rollout_gpus + (r.num_learners * r.learner_gpus if with_learner else 0)}
    have = ray.cluster_resources()
    knobs = {"CPU": "ray.env_pools x ray.env_pool_cpus + rollout.num_workers x ray.rollout_cpus",
             "GPU": "rollout.num_workers x ray.rollout_gpus"}
    for kind, need in wants.items():
        if need > have.get(kind, 0.0) + 1e-9:
            learners = f" + ray.num_learners x ray.learner_{kind.lower()}s" if with_learner else ""
            raise RuntimeError(
                f"the Ray cluster has {have.get(kind, 0.0):g} {kind} but the topology needs {need:g} "
                f"({knobs[kind]}{learners}); lower those settings or add nodes")


def _actor_env(cpus: float, *, gpu: bool = False, log_name: str) -> dict:
    """Per-actor runtime_env: deployment env vars plus torch threads matching reserved CPUs; the
    actor's output goes to RUN/logs/<log_name>.log when logs are routed (`deploy.logs`)."""
    n = max(1, round(cpus))
    env = {**WORKER_ENV, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
    if gpu:
        env.pop("DS_ACCELERATOR")
    return logs.actor_runtime_env({"env_vars": env}, log_name)


def start_env_pools(cfg: TrainConfig) -> list:
    """EnvPool actors, restarted by Ray when they die (episodes in flight end with env_error)."""
    import ray

    from deploy.actors import RemoteEnvPool
    from envs.pool import EnvPool

    actor_cls = ray.remote(EnvPool)
    pools = []
    for i in range(cfg.ray.env_pools):
        handle = actor_cls.options(
            name=f"env_pool_{i}", num_cpus=cfg.ray.env_pool_cpus, max_restarts=-1,
            max_task_retries=0, runtime_env=_actor_env(1, log_name=f"env_pool_{i}"),
        ).remote(cfg.env, cfg.ray.envs_per_pool)
        pools.append(RemoteEnvPool(handle, cfg.ray.envs_per_pool, name=f"env_pool_{i}",
                                   namespace=ray.get_runtime_context().namespace))
    return pools


def start_rollout_workers(cfg: TrainConfig, model_path: str, pools: Sequence) -> list:
    """RolloutWorker actors; pool i serves worker i % num_workers. Ray restarts a dead worker up
    to run.max_restarts times (from `model_path`: `deploy.cluster.Cluster` then reloads the
    current weights and re-runs the calls it lost)."""
    import ray

    from rollout_workers.worker import RolloutWorker

    n = cfg.rollout.num_workers
    if len(pools) < n:
        raise ValueError(f"ray.env_pools={len(pools)} must be >= rollout.num_workers={n}")
    actor_cls = ray.remote(RolloutWorker)
    workers = []
    for w in range(n):
        mine = [p for i, p in enumerate(pools) if i % n == w]
        workers.append(actor_cls.options(
            name=f"rollout_worker_{w}", num_cpus=cfg.ray.rollout_cpus, num_gpus=cfg.ray.rollout_gpus,
            max_restarts=cfg.run.max_restarts, max_task_retries=0,
            runtime_env=_actor_env(cfg.ray.rollout_cpus, gpu=cfg.ray.rollout_gpus > 0, log_name=f"rollout_worker_{w}"),
        ).remote(cfg.engine, cfg.rollout, model_path, mine))
    return workers


def _rendezvous() -> tuple[str, int, str, str]:
    """Runs inside the learners' placement group, on the node every rank shares (STRICT_PACK):
    loopback, a free port for the variables DeepSpeed reads, a fresh file for the process
    group's FileStore (so no rendezvous socket listens beyond loopback), and the node's id."""
    import socket
    import tempfile
    import uuid
    from pathlib import Path

    import ray

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from deploy.reaper import RENDEZVOUS_PREFIX, TOKEN_VAR

    # Named after the driver's token where it has one, so its reaper finds the file (`deploy.reaper`).
    owner = f"{os.environ[TOKEN_VAR]}-" if TOKEN_VAR in os.environ else ""
    path = str(Path(tempfile.gettempdir()) / f"{RENDEZVOUS_PREFIX}{owner}{uuid.uuid4().hex}")
    return "127.0.0.1", port, path, ray.get_runtime_context().get_node_id()


def _remove_file(path: str) -> None:
    from pathlib import Path

    Path(path).unlink(missing_ok=True)


@dataclass
class LearnerGroup:
    """The learner ranks of one process group: a group that lost a rank cannot continue and is
    replaced as a whole (`stop_learners`, then `start_learners`: new placement group, new
    rendezvous file)."""

    actors: list
    placement_group: object
    rendezvous_file: str
    node_id: str


def start_learners(cfg: TrainConfig, model_path: str) -> LearnerGroup:
    """DeepSpeed ranks as Ray actors, packed onto one node by a STRICT_PACK placement group
    (ZeRO over NVLink/loopback); the rendezvous address is probed on that node, so it is right
    under `ray job submit` as well as locally. Collectives give up after ray.collective_timeout_s."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from deploy.actors import LearnerActor

    r = cfg.ray
    bundle = {"CPU": r.learner_cpus, **({"GPU": r.learner_gpus} if r.learner_gpus else {})}
    group = placement_group([bundle] * r.num_learners, strategy="STRICT_PACK", name="learners")
    if not group.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
        raise RuntimeError(f"{r.num_learners} learner ranks of {bundle} do not fit on one node; "
                           "lower ray.num_learners / ray.learner_cpus / ray.learner_gpus")

    def in_bundle(i: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)

    addr, port, store_file, node_id = ray.get(
        ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=in_bundle(0)).remote(),
        timeout=PLACEMENT_TIMEOUT_S)
    actor_cls = ray.remote(LearnerActor)
    actors = [
        actor_cls.options(
            name=f"learner_{rank}", num_cpus=r.learner_cpus, num_gpus=r.learner_gpus,
            scheduling_strategy=in_bundle(rank),
            runtime_env=_actor_env(r.learner_cpus, gpu=r.learner_gpus > 0, log_name=f"learner_rank{rank}"),
        ).remote(cfg.learner, model_path, rank=rank, world_size=r.num_learners, master_addr=addr, master_port=port,
                  rendezvous_file=store_file, collective_timeout_s=r.collective_timeout_s)
        for rank in range(r.num_learners)
    ]
    return LearnerGroup(actors=actors, placement_group=group, rendezvous_file=store_file, node_id=node_id)


def stop_learners(group: LearnerGroup) -> None:
    """Kill every rank (no restart), release the placement group's resources, and delete the
    rendezvous file on its node (a killed rank never cleans up its FileStore)."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for actor in group.actors:
        ray.kill(actor, no_restart=True)
    remove_placement_group(group.placement_group)
    where = NodeAffinitySchedulingStrategy(group.node_id, soft=True)
    try:
        ray.get(ray.remote(_remove_file).options(num_cpus=0, scheduling_strategy=where).remote(group.rendezvous_file),
                timeout=60)
    except Exception as err:  # noqa: BLE001 - a leftover file in the node's tmp is harmless
        log.warning("could not remove the learner rendezvous file %s: %s", group.rendezvous_file, err)
