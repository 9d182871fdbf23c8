"""Elastic rollout workers (`rollout.num_workers: auto`, docs/pipeline.md "Elastic rollout workers").

The cluster starts with one rollout worker. Between training steps (never during a collect) the
driver calls `ElasticRollout.rescale`: it reads every node's liveness and free resources,
`plan_scale` decides, and then
- workers whose node left (or is draining) are removed with their env pools; nothing is in
  flight between steps, so nothing is lost (a worker lost *during* a collect is handled by
  `deploy.cluster.Cluster`: its calls are re-run on the surviving workers);
- one new worker with its own `ray.env_pools` env pools is started per free slot found, pinned to
  the node that has the room, up to `rollout.max_workers`; it loads the current policy weights
  and is checked to hold them (`Cluster.add_workers`) before its first collect.
Learner ranks are never touched. A weight-sync group (`sync.method: broadcast`) is rebuilt with the
new membership at the next sync.

`plan_scale` and `units_that_fit` are pure (tested in tests/deploy/test_elastic_logic.py); the
Ray reads are `cluster_nodes` and `actor_node`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploy.config import TrainConfig

log = logging.getLogger(__name__)

EPS = 1e-9


@dataclass(frozen=True)
class NodeView:
    """One Ray node as the planner sees it."""

    node_id: str
    alive: bool
    available: Mapping[str, float] = field(default_factory=dict)
    """Free resources now (CPU, GPU, custom)."""
    draining: bool = False
    """The node is being drained (autoscaler scale-down): no new workers, existing ones leave."""


@dataclass(frozen=True)
class WorkerView:
    name: str
    node_id: str | None
    """Where the worker runs; None when unknown (never removed for its node then)."""
    gone: bool = False
    """Ray reports the actor dead, or restarting while its node is not alive (`is_lost`)."""


@dataclass(frozen=True)
class ScalePlan:
    remove: tuple[str, ...] = ()
    """Names of workers whose node is gone or draining."""
    add: tuple[str, ...] = ()
    """One node id per worker to start there."""

    @property
    def changed(self) -> bool:
        return bool(self.remove or self.add)


def unit_demand(cfg: TrainConfig) -> dict[str, float]:
    """What one elastic unit holds: a rollout worker (ray.rollout_cpus / ray.rollout_gpus) and its
    ray.env_pools env pools (ray.env_pool_cpus each)."""
    r = cfg.ray
    demand = {"CPU": r.rollout_cpus + r.env_pools * r.env_pool_cpus}
    if r.rollout_gpus > 0:
        demand["GPU"] = r.rollout_gpus
    return demand


def units_that_fit(available: Mapping[str, float], demand: Mapping[str, float]) -> int:
    """How many units of `demand` fit in `available` (resources not asked for are ignored)."""
    counts = [math.floor((available.get(k, 0.0) + EPS) / need) for k, need in demand.items() if need > 0]
    return max(0, min(counts)) if counts else 0


def plan_scale(nodes: Sequence[NodeView], workers: Sequence[WorkerView], demand: Mapping[str, float],
               max_workers: int) -> ScalePlan:
    """Remove the workers that are gone or whose node is not alive or is draining; then fill free room, node by
    node in the given order, with new units until there are `max_workers` workers. Freed
    resources of removed workers are not reused (their node is leaving)."""
    if max_workers < 1:
        raise ValueError(f"rollout.max_workers={max_workers} must be >= 1")
    usable = {n.node_id for n in nodes if n.alive and not n.draining}
    remove = tuple(w.name for w in workers if w.gone or (w.node_id is not None and w.node_id not in usable))
    room = max_workers - (len(workers) - len(remove))
    add: list[str] = []
    for node in nodes:
        if room <= 0:
            break
        if node.node_id not in usable:
            continue
        k = min(units_that_fit(node.available, demand), room)
        add += [node.node_id] * k
        room -= k
    return ScalePlan(remove=remove, add=tuple(add))


def reassign_lost(owners: Sequence[int | None], num_workers: int) -> list[int]:
    """Calls to re-run: `owners[i]` is the worker index of call i, None when its worker was
    removed (its node left). Those go round-robin over the `num_workers` survivors; the others stay."""
    if num_workers < 1 and any(o is None for o in owners):
        raise RuntimeError("calls of a lost rollout worker cannot be re-run: no rollout worker is left")
    out, k = [], 0
    for owner in owners:
        if owner is None:
            owner, k = k % num_workers, k + 1
        out.append(owner)
    return out


# ---- Ray reads ---------------------------------------------------------------------------------
def cluster_nodes() -> list[NodeView]:
    """Every node Ray knows, with its free resources now. Per-node free resources and draining
    nodes come from Ray's GCS state (`ray._private.state`, Ray 2.60 as pinned): the public
    `ray.available_resources()` only sums them over the cluster."""
    import ray
    from ray._private import state

    free = state.available_resources_per_node()
    try:
        draining = set(state.state.get_draining_nodes())
    except Exception:  # noqa: BLE001 - older GCS without drain info: no node counts as draining
        draining = set()
    return [NodeView(node_id=n["NodeID"], alive=bool(n["Alive"]), available=dict(free.get(n["NodeID"], {})),
                     draining=n["NodeID"] in draining) for n in ray.nodes()]


def actor_node(handle) -> tuple[str | None, str, str]:
    """(node id, state, name) of an actor from Ray's actor table (GCS; no dashboard needed);
    (None, "UNKNOWN", "") when it has no entry."""
    from ray._private import state

    entry = state.state.actor_table(handle._actor_id.hex())
    if not entry:
        return None, "UNKNOWN", ""
    node = (entry.get("Address") or {}).get("NodeID") or None
    return node, str(entry.get("State", "UNKNOWN")), str(entry.get("Name", ""))


def is_lost(state: str, node_id: str | None, alive_nodes: set[str]) -> bool:
    """A rollout worker cannot come back when Ray marked it DEAD (e.g. pinned to a node that left),
    or when it is not alive and the node it ran on is gone (a restart would need room elsewhere
    that no plan reserved). Ray clears a dead actor's address, so the state decides first."""
    if state == "DEAD":
        return True
    return state != "ALIVE" and node_id is not None and node_id not in alive_nodes


def worker_lost(handle) -> bool:
    """`is_lost` for a worker, from Ray's actor table and node list."""
    import ray

    node, state, _ = actor_node(handle)
    return is_lost(state, node, {n["NodeID"] for n in ray.nodes() if n["Alive"]})


def kill_unit(handle: Any, pools: Sequence[Any]) -> None:
    """Kill a rollout worker and its env pools (`deploy.actors.RemoteEnvPool`) for good."""
    import ray

    for h in [handle, *(p.handle for p in pools)]:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone with its node
            log.debug("actor %s was already gone", h)


# ---- the controller ------------------------------------------------------------------------------
SETTLED = frozenset({"ALIVE", "DEAD"})
"""Actor states in which an actor holds its resources for good or has released them."""


class ElasticRollout:
    """Adds and removes rollout workers of a `deploy.cluster.Cluster` between steps (`rescale`); a
    no-op that only reports `rollout/num_workers` when rollout.num_workers is a number."""

    def __init__(self, cfg: TrainConfig, cluster: Any):
        self.cfg, self.cluster = cfg, cluster
        self.enabled = cfg.rollout.num_workers == "auto"
        self.max_workers = cfg.rollout.max_workers or cluster.num_workers
        self._next_worker = cluster.num_workers
        self._next_pool = len(cluster.pools)

    def _settle(self) -> None:
        """Wait (at most ray.call_timeout_s, reading Ray's actor table, so no call queues behind a
        collect in flight) until every worker and env pool is ALIVE or DEAD: an actor still being
        scheduled has not taken its CPUs yet, and a plan made then would start a unit that no node
        can hold (right after start-up, the first rescale saw the first unit's CPUs as free)."""
        handles = [*self.cluster.workers, *(p.handle for p in self.cluster.pools)]
        deadline = time.monotonic() + self.cfg.ray.call_timeout_s
        while any(actor_node(h)[1] not in SETTLED for h in handles) and time.monotonic() < deadline:
            time.sleep(0.2)

    def _views(self, nodes: Sequence[NodeView]) -> list[WorkerView]:
        alive = {n.node_id for n in nodes if n.alive}
        views = []
        for w, handle in enumerate(self.cluster.workers):
            node, state, name = actor_node(handle)
            views.append(WorkerView(name=name or f"rollout worker #{w}", node_id=node, gone=is_lost(state, node, alive)))
        return views

    def rescale(self, step: int) -> dict[str, float]:
        """Between steps: apply `plan_scale`; returns the step's `rollout/num_workers` (after the
        change, i.e. the workers the next collect uses) and `elastic/added`, `elastic/removed`."""
        if not self.enabled:
            return {"rollout/num_workers": float(self.cluster.num_workers)}
        start = time.perf_counter()
        self._settle()
        nodes = cluster_nodes()
        views = self._views(nodes)
        plan = plan_scale(nodes, views, unit_demand(self.cfg), self.max_workers)
        gone = [w for w, v in enumerate(views) if v.name in plan.remove]
        removed = self.cluster.remove_workers(gone, reason="its node left or is draining") if gone else 0
        added = self._add(plan.add) if plan.add else 0
        if self.cluster.num_workers == 0:
            raise RuntimeError(f"step {step}: every rollout worker is gone with its node and no node has room for "
                               f"one ({unit_demand(self.cfg)}); add a node or lower ray.rollout_cpus / ray.env_pools")
        if plan.changed:
            log.warning("step %d: rollout workers %+d added, %d removed -> %d (rollout.max_workers=%d) in %.1fs",
                        step, added, removed, self.cluster.num_workers, self.max_workers, time.perf_counter() - start)
        return {"rollout/num_workers": float(self.cluster.num_workers), "elastic/added": float(added),
                "elastic/removed": float(removed)}

    def _add(self, node_ids: Sequence[str]) -> int:
        from deploy.topology import start_env_pools, start_rollout_workers

        workers, pools = [], []
        for node in node_ids:
            mine = start_env_pools(self.cfg, first=self._next_pool, node_id=node)
            workers += start_rollout_workers(self.cfg, self.cluster.model_path, mine, count=1, first=self._next_worker,
                                             node_id=node)
            pools.append(mine)
            self._next_pool += len(mine)
            self._next_worker += 1
        return self.cluster.add_workers(workers, pools)
