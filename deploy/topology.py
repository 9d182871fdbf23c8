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
from deploy.placement import colocated_gpus, engine_bundles, learner_slot
from envs.registry import plugin_env_vars
from rollout_workers.engines.vllm_engine import COLOCATED_VAR

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
    need = r.env_pools * r.env_pool_cpus + cfg.rollout.initial_workers * r.rollout_cpus
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
        # address="local": a new cluster of this driver's own, even when a `ray start` node runs on
        # this machine (plain ray.init() would join it and then refuse num_cpus).
        kwargs.update(address="local", num_cpus=max(cores, math.ceil(_required_cpus(cfg, with_learner=True))),
                      include_dashboard=False)
    # No job-level runtime_env here: under `ray job submit` the job's own (working_dir, env) stays.
    ray.init(**kwargs)


def check_resources(cfg: TrainConfig, *, with_learner: bool) -> None:
    """Fail fast, naming the knobs, when the actors could never all be scheduled (Ray would
    otherwise leave them pending forever)."""
    import ray

    r = cfg.ray
    bank = cfg.uniskill.bank
    bank_gpus = bank.embedding_gpus if cfg.uniskill.enabled and bank.embedding_device == "cuda" else 0.0
    wants = {"CPU": _required_cpus(cfg, with_learner),
             "GPU": cfg.rollout.initial_workers * r.rollout_gpus + (r.num_learners * r.learner_gpus if with_learner else 0)
             + bank_gpus}
    if r.placement == "colocated":  # a whole GPU per engine rank, shared with its learner rank
        wants["GPU"] = colocated_gpus(cfg) + bank_gpus
    have = ray.cluster_resources()
    knobs = {"CPU": "ray.env_pools x ray.env_pool_cpus + rollout.num_workers x ray.rollout_cpus",
             "GPU": "rollout.num_workers x ray.rollout_gpus"
             + (" + uniskill.bank.embedding_gpus (embedding_device=cuda)" if bank_gpus else "")}
    for kind, need in wants.items():
        if need > have.get(kind, 0.0) + 1e-9:
            learners = f" + ray.num_learners x ray.learner_{kind.lower()}s" if with_learner else ""
            raise RuntimeError(
                f"the Ray cluster has {have.get(kind, 0.0):g} {kind} but the topology needs {need:g} "
                f"({knobs[kind]}{learners}); lower those settings or add nodes")


def _actor_env(cpus: float, *, gpu: bool = False, log_name: str, threads: int | None = None) -> dict:
    """Per-actor runtime_env: deployment env vars plus torch threads (`threads`, by default the
    reserved CPUs); the actor's output goes to RUN/logs/<log_name>.log when logs are routed
    (`deploy.logs`)."""
    n = threads or max(1, round(cpus))
    # plugin_env_vars: environments a config loaded by `env.plugin`, so the actor resolves their names too
    env = {**WORKER_ENV, **plugin_env_vars(), "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
    if gpu:
        env.pop("DS_ACCELERATOR")
    return logs.actor_runtime_env({"env_vars": env}, log_name)


def _on_node(node_id: str | None) -> dict:
    """Ray options pinning an actor to `node_id` (None: Ray places it). Hard affinity: an elastic
    worker and its pools go where `deploy.elastic.plan_scale` found room for them."""
    if node_id is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def start_env_pools(cfg: TrainConfig, *, first: int = 0, node_id: str | None = None) -> list:
    """`ray.env_pools` EnvPool actors named env_pool_{first}..., restarted by Ray when they die
    (episodes in flight end with env_error); on `node_id` when given (`deploy.elastic`)."""
    import ray

    from deploy.actors import RemoteEnvPool
    from envs.pool import EnvPool

    actor_cls = ray.remote(EnvPool)
    pools = []
    for i in range(first, first + cfg.ray.env_pools):
        handle = actor_cls.options(
            name=f"env_pool_{i}", num_cpus=cfg.ray.env_pool_cpus, max_restarts=-1,
            max_task_retries=0, runtime_env=_actor_env(1, log_name=f"env_pool_{i}"), **_on_node(node_id),
        ).remote(cfg.env, cfg.ray.envs_per_pool)
        pools.append(RemoteEnvPool(handle, cfg.ray.envs_per_pool, name=f"env_pool_{i}",
                                   namespace=ray.get_runtime_context().namespace))
    return pools


_ROLLOUT_GROUPS: list = []
"""Placement groups made by `rollout_worker_options` in this process (`remove_rollout_placements`)."""
_ENGINE_GROUPS: dict[int, object] = {}
"""Colocated placement: rollout worker w's placement group, whose bundles its learner ranks share."""


def rollout_bundles(cfg: TrainConfig) -> list[dict[str, float]] | None:
    """The placement of one RolloutWorker whose vLLM engine is tensor-parallel (None when it is
    not: the actor then simply holds `ray.rollout_gpus`). One bundle per tensor-parallel rank, each
    with one whole GPU; the worker itself (the vLLM driver, no GPU of its own) runs in bundle 0 with
    its CPUs. Inside a placement group vLLM picks its Ray executor and starts one GPU worker per
    bundle (vllm/config/parallel.py, vllm/v1/executor/ray_utils.py); STRICT_PACK keeps the ranks on
    one node (tensor parallelism needs NVLink). `TrainConfig` has checked ray.rollout_gpus == tp."""
    tp = cfg.engine.tensor_parallel_size
    if cfg.ray.placement == "colocated":  # the learner ranks beside the engine's ranks share its bundles
        return engine_bundles(cfg)
    if tp == 1:
        return None
    return [{"CPU": cfg.ray.rollout_cpus, "GPU": 1.0}] + [{"GPU": 1.0} for _ in range(tp - 1)]


def rollout_worker_options(cfg: TrainConfig, w: int) -> dict:
    """Ray options of RolloutWorker `w`; for a tensor-parallel engine this reserves its placement
    group first (named `rollout_worker_{w}`, released with the job), failing with the knobs to
    change when it cannot be placed."""
    r = cfg.ray
    options = {"name": f"rollout_worker_{w}", "num_cpus": r.rollout_cpus, "num_gpus": r.rollout_gpus,
               "runtime_env": _actor_env(r.rollout_cpus, gpu=r.rollout_gpus > 0, log_name=f"rollout_worker_{w}")}
    colocated = r.placement == "colocated"
    if colocated:  # vLLM's tensor-parallel workers take the engine's share of each GPU (vllm/envs.py)
        options["runtime_env"]["env_vars"].update({COLOCATED_VAR: "1", "VLLM_RAY_PER_WORKER_GPUS": f"{r.rollout_gpus:g}"})
    bundles = rollout_bundles(cfg)
    if bundles is None:
        return options
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(bundles, strategy="STRICT_PACK", name=f"rollout_worker_{w}")
    _ROLLOUT_GROUPS.append(group)
    if colocated:
        _ENGINE_GROUPS[w] = group
    if not group.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
        raise RuntimeError(f"rollout worker {w}: engine.tensor_parallel_size={len(bundles)} GPUs (+ ray.rollout_cpus="
                           f"{r.rollout_cpus:g} CPUs) do not fit on one node; lower engine.tensor_parallel_size "
                           "or rollout.num_workers, or add nodes")
    gpus = r.rollout_gpus if colocated and len(bundles) == 1 else 0  # else vLLM's workers hold the GPUs
    return {**options, "num_gpus": gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)}


def remove_rollout_placements() -> int:
    """Release the placement groups this driver made for tensor-parallel RolloutWorkers (after their
    actors are killed: a driver that starts workers again in the same Ray session needs the GPUs
    back; a finished job releases them anyway). Returns how many were removed."""
    from ray.util.placement_group import remove_placement_group

    removed = 0
    _ENGINE_GROUPS.clear()
    while _ROLLOUT_GROUPS:
        remove_placement_group(_ROLLOUT_GROUPS.pop())
        removed += 1
    return removed


def start_rollout_workers(cfg: TrainConfig, model_path: str, pools: Sequence, *, count: int | None = None,
                          first: int = 0, node_id: str | None = None) -> list:
    """`count` (default `rollout.initial_workers`) RolloutWorker actors named rollout_worker_{first}...;
    pool i serves worker i % count. Ray restarts a dead worker up to run.max_restarts times (from
    `model_path`: `deploy.cluster.Cluster` then reloads the current weights and re-runs the calls
    it lost). A tensor-parallel engine gets a placement group of its own (`rollout_bundles`). On
    `node_id` when given (an elastic worker, `deploy.elastic`)."""
    import ray

    from rollout_workers.colocation import ColocatedRolloutWorker
    from rollout_workers.worker import RolloutWorker

    n = count if count is not None else cfg.rollout.initial_workers
    if len(pools) < n:
        raise ValueError(f"ray.env_pools={len(pools)} must be >= rollout.num_workers={n}")
    actor_cls = ray.remote(ColocatedRolloutWorker if cfg.ray.placement == "colocated" else RolloutWorker)
    workers = []
    for w in range(n):
        mine = [p for i, p in enumerate(pools) if i % n == w]
        workers.append(actor_cls.options(
            max_restarts=cfg.run.max_restarts, max_task_retries=0,
            **{**rollout_worker_options(cfg, first + w), **_on_node(node_id)},
        ).remote(cfg.engine, cfg.rollout, model_path, mine))
    return workers


def _rendezvous(multi_node: bool) -> tuple[str, int, str, str]:
    """Runs inside the learners' placement group, in rank 0's bundle: (address, free port, store,
    node id). All ranks on one node: loopback, and a fresh file for the process group's FileStore
    (so no rendezvous socket listens beyond loopback). Ranks on several nodes: this node's address
    and "tcp://ADDRESS:PORT", the TCPStore rank 0 serves (`learner.backends`) on a port free now,
    drawn outside Ray's and the kernel's ephemeral ranges (`TCP_PORTS`) so it stays free until then."""
    import socket
    import tempfile
    import uuid
    from pathlib import Path

    import ray

    node_id = ray.get_runtime_context().get_node_id()
    if multi_node:
        addr = ray.util.get_node_ip_address()
        port = free_tcp_port(addr)
        return addr, port, f"tcp://{addr}:{port}", node_id
    addr = "127.0.0.1"
    with socket.socket() as sock:  # on one node only an environment variable for DeepSpeed: nothing binds it
        sock.bind((addr, 0))
        port = sock.getsockname()[1]
    from deploy.reaper import RENDEZVOUS_PREFIX, TOKEN_VAR

    # Named after the driver's token where it has one, so its reaper finds the file (`deploy.reaper`).
    owner = f"{os.environ[TOKEN_VAR]}-" if TOKEN_VAR in os.environ else ""
    path = str(Path(tempfile.gettempdir()) / f"{RENDEZVOUS_PREFIX}{owner}{uuid.uuid4().hex}")
    return addr, port, path, node_id


TCP_PORTS = (20_000, 32_768)
"""Where rank 0's TCPStore port is drawn from: above Ray's default worker ports (10002-19999) and
below Linux's default ephemeral range (32768-60999), so no outgoing connection takes it between
the probe and rank 0's bind."""


def free_tcp_port(addr: str, *, purpose: str = "the learner rendezvous") -> int:
    """A port of `addr` free now, drawn from `TCP_PORTS` (a store server binds it later: the learner
    rendezvous, and the weight-sync group's TCPStore across nodes, `deploy.weight_sync`)."""
    import random
    import socket

    for _ in range(100):
        port = random.randrange(*TCP_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind((addr, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {TCP_PORTS[0]}-{TCP_PORTS[1] - 1} on {addr} for {purpose}")


def _remove_file(path: str) -> None:
    from pathlib import Path

    Path(path).unlink(missing_ok=True)


@dataclass
class LearnerGroup:
    """The learner ranks of one process group: a group that lost a rank cannot continue and is
    replaced as a whole (`stop_learners`, then `start_learners`: new placement group, new
    rendezvous)."""

    actors: list
    placement_group: object | None
    rendezvous_file: str
    """A FileStore path on `node_id` (one node) or "tcp://ADDRESS:PORT" (ranks on several nodes)."""
    node_id: str
    """Rank 0's node."""


@dataclass
class LearnerPlacement:
    """Where the learner ranks go: bundle i of `placement_group` holds rank i."""

    placement_group: object | None
    """None under colocated placement: rank i runs in `slots[i]` of the engines' groups."""
    rank_nodes: list[str]
    """The node id of each rank."""
    master_addr: str
    master_port: int
    rendezvous: str
    """What `learner.backends.init_process_group_on_node` takes: a file path or tcp://ADDRESS:PORT."""
    slots: list[tuple[object, int]] | None = None
    """Colocated placement: (placement group, bundle) of each rank."""

    def strategy(self, rank: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group, index = self.slots[rank] if self.slots is not None else (self.placement_group, rank)
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def place_learners(cfg: TrainConfig) -> LearnerPlacement:
    """Reserve one bundle per learner rank with a PACK placement group: every rank on one node
    when it fits (ZeRO over NVLink/loopback, FileStore rendezvous), spread over the fewest nodes
    when it does not (a model that outgrows one node), then a TCP rendezvous at rank 0's node.
    The rendezvous address is probed in rank 0's bundle, so it is right under `ray job submit` as
    well as locally."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    r = cfg.ray
    bundle = {"CPU": r.learner_cpus, **({"GPU": r.learner_gpus} if r.learner_gpus else {})}
    group = placement_group([bundle] * r.num_learners, strategy="PACK", name="learners")
    if not group.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
        raise RuntimeError(f"{r.num_learners} learner ranks of {bundle} do not fit in the Ray cluster; "
                           "lower ray.num_learners / ray.learner_cpus / ray.learner_gpus, or add nodes")
    by_bundle = placement_group_table(group)["bundles_to_node_id"]
    nodes = [by_bundle[i] for i in range(r.num_learners)]
    where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    addr, port, store, _ = ray.get(
        ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=where).remote(len(set(nodes)) > 1),
        timeout=PLACEMENT_TIMEOUT_S)
    if len(set(nodes)) > 1:
        log.info("learner ranks span %d nodes; rendezvous at %s", len(set(nodes)), store)
    return LearnerPlacement(placement_group=group, rank_nodes=nodes, master_addr=addr, master_port=port,
                            rendezvous=store)


def place_colocated_learners(cfg: TrainConfig) -> LearnerPlacement:
    """Colocated placement: learner rank i goes into the bundle of the engine rank it shares a
    device with (`deploy.placement.learner_slot`), in the placement groups the rollout workers
    reserved; the rendezvous is probed in rank 0's bundle, as `place_learners` does."""
    import ray
    from ray.util.placement_group import placement_group_table

    slots = []
    for rank in range(cfg.ray.num_learners):
        engine, index = learner_slot(cfg, rank)
        if engine not in _ENGINE_GROUPS:
            raise RuntimeError(f"learner rank {rank} shares rollout_worker_{engine}'s devices, which has no placement "
                               "group: start the rollout workers before the learners")
        slots.append((_ENGINE_GROUPS[engine], index))
    nodes = [placement_group_table(g)["bundles_to_node_id"][i] for g, i in slots]
    place = LearnerPlacement(placement_group=None, rank_nodes=nodes, master_addr="", master_port=0, rendezvous="",
                             slots=slots)
    addr, port, store, _ = ray.get(ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=place.strategy(0))
                                   .remote(len(set(nodes)) > 1), timeout=PLACEMENT_TIMEOUT_S)
    place.master_addr, place.master_port, place.rendezvous = addr, port, store
    return place


def start_learners(cfg: TrainConfig, model_path: str) -> LearnerGroup:
    """DeepSpeed ranks as Ray actors, placed by `place_learners`. Collectives give up after
    ray.collective_timeout_s."""
    import ray

    from deploy.actors import LearnerActor

    r = cfg.ray
    place = place_colocated_learners(cfg) if r.placement == "colocated" else place_learners(cfg)
    actor_cls = ray.remote(LearnerActor)
    actors = [
        actor_cls.options(
            name=f"learner_{rank}", num_cpus=r.learner_cpus, num_gpus=r.learner_gpus,
            scheduling_strategy=place.strategy(rank),
            runtime_env=_actor_env(r.learner_cpus, gpu=r.learner_gpus > 0, log_name=f"learner_rank{rank}",
                                   threads=r.learner_threads),
        ).remote(cfg.learner, model_path, rank=rank, world_size=r.num_learners, master_addr=place.master_addr,
                  master_port=place.master_port, rendezvous_file=place.rendezvous,
                  collective_timeout_s=r.collective_timeout_s)
        for rank in range(r.num_learners)
    ]
    return LearnerGroup(actors=actors, placement_group=place.placement_group, rendezvous_file=place.rendezvous,
                        node_id=place.rank_nodes[0])


def stop_learners(group: LearnerGroup) -> None:
    """Kill every rank (no restart), release the placement group's resources, and delete the
    rendezvous file on rank 0's node (a killed rank never cleans up its FileStore)."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for actor in group.actors:
        ray.kill(actor, no_restart=True)
    if group.placement_group is not None:  # colocated ranks live in the engines' groups, which stay
        remove_placement_group(group.placement_group)
    if group.rendezvous_file.startswith("tcp://"):
        return  # rank 0's TCPStore went with it
    where = NodeAffinitySchedulingStrategy(group.node_id, soft=True)
    try:
        ray.get(ray.remote(_remove_file).options(num_cpus=0, scheduling_strategy=where).remote(group.rendezvous_file),
                timeout=60)
    except Exception as err:  # noqa: BLE001 - a leftover file in the node's tmp is harmless
        log.warning("could not remove the learner rendezvous file %s: %s", group.rendezvous_file, err)
