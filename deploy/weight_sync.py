"""The driver's side of collective weight sync (`sync.method: broadcast`, docs/architecture.md
"Weight sync"): it builds the weight-sync group (learner rank 0 = rank 0, then every vLLM worker
of every rollout engine), runs one sync as concurrent calls (every learner rank streams, every
engine receives: every weight, or with LoRA the adapter tensors alone), names whoever failed,
and measures the log-prob probe (`sync.verify`: a per-step
metric, never a gate; exact checks decide whether an engine holds the policy's weights).

The group is built lazily at the first broadcast and rebuilt after anything that replaced one of
its processes (a restarted rollout worker, a new learner group, a failed broadcast); `rebuilds`
counts the rebuilds (metrics.jsonl `sync/group_rebuilds`, and a line in the run log). A member
whose collective failed has already aborted its side of the group (`weightsync.group`), so a
failed group needs no teardown call from here.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy.config import TrainConfig
from learner.lora import adapter_spec
from learner.types import TrainRow
from weightsync.adapter import AdapterSpec
from weightsync.group import GroupSpec

log = logging.getLogger(__name__)

PROBE_TEXT = "You are in the middle of a room. Looking quickly around you, you see a cabinet 1."
"""The fixed probe an engine continues and the learner re-scores (`Cluster.probe_weights`)."""
PROBE_TOKENS = 8
MARGIN_S = 30.0
"""Added to sync.timeout_s for the driver's own wait (the members time out first, with a message)."""


class WeightSyncFailed(RuntimeError):
    """A broadcast sync failed; the message names the members concerned."""

    def __init__(self, message: str, *, dead: Sequence[str] = ()):
        super().__init__(message)
        self.dead = list(dead)


def _rendezvous(multi_node: bool) -> tuple[str, int, str | None]:
    """Runs on learner rank 0's node: (address, free port, FileStore path or None). One node:
    loopback and a store file (nothing listens on the network; named so the driver's reaper
    deletes it; the port is unused). Several nodes: this node's address and a port for rank 0's
    TCPStore, drawn as the learner rendezvous draws its own (`deploy.topology.free_tcp_port`: outside
    Ray's and the kernel's ephemeral ranges, so it stays free until rank 0 binds it)."""
    import os
    import tempfile
    from pathlib import Path

    import ray

    from deploy.reaper import RENDEZVOUS_PREFIX, TOKEN_VAR
    from deploy.topology import free_tcp_port

    if multi_node:
        host = ray.util.get_node_ip_address()
        return host, free_tcp_port(host, purpose="the weight-sync store"), None
    owner = f"{os.environ[TOKEN_VAR]}-" if TOKEN_VAR in os.environ else ""
    return "127.0.0.1", 0, str(Path(tempfile.gettempdir()) / f"{RENDEZVOUS_PREFIX}{owner}weights-{uuid.uuid4().hex}")


def _wait_all(refs: Sequence[Any], names: Sequence[str], *, timeout_s: float) -> tuple[list, dict[str, str]]:
    """Every ref's value (None where it failed) and {name: reason} of those that failed or did
    not answer within timeout_s."""
    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout_s
    values: list = [None] * len(refs)
    failed: dict[str, str] = {}
    pending = {ref: i for i, ref in enumerate(refs)}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        i = pending.pop(ready[0])
        try:
            values[i] = ray.get(ready[0])
        except RayActorError as err:
            failed[names[i]] = f"the actor died ({type(err).__name__})"
        except Exception as err:  # noqa: BLE001 - reported with the member's name
            text = str(err).strip().splitlines()
            failed[names[i]] = text[-1] if text else type(err).__name__
    for i in pending.values():
        failed[names[i]] = f"no answer within {timeout_s:g}s"
    return values, failed


@dataclass
class BroadcastSync:
    cfg: TrainConfig
    spec: GroupSpec | None = None
    builds: int = 0
    """Groups formed so far (the first one, then one per rebuild)."""

    @property
    def rebuilds(self) -> int:
        return max(self.builds - 1, 0)

    def reset(self) -> None:
        """Forget the group: the next sync builds a new one (members replace their old one)."""
        self.spec = None

    def _timeout(self) -> float:
        return self.cfg.sync.timeout_s + MARGIN_S

    def ensure_group(self, learner0: Any, learner_node_id: str | None, workers: Sequence[Any]) -> GroupSpec:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from deploy.recovery import get_all

        if self.spec is not None:
            return self.spec
        # every member answers first (an actor still starting up would otherwise use up the join's
        # sync.timeout_s); the learner's answer is only that it is up
        *counts, _ = get_all([*(w.weight_group_ranks.remote() for w in workers), learner0.get_version.remote()],
                             timeout_s=self.cfg.ray.call_timeout_s, what="weight-sync group members",
                             knob="ray.call_timeout_s")
        members = ["learner_0"]
        for w, n in enumerate(counts):
            members += [f"rollout_worker_{w}" + (f"/tp{j}" if n > 1 else "") for j in range(n)]
        multi_node = sum(1 for node in ray.nodes() if node.get("Alive")) > 1
        where = {} if learner_node_id is None else {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(learner_node_id, soft=False)}
        host, port, store_file = ray.get(ray.remote(_rendezvous).options(num_cpus=0, **where).remote(multi_node),
                                         timeout=self._timeout())
        spec = GroupSpec(name=uuid.uuid4().hex, members=tuple(members), timeout_s=self.cfg.sync.timeout_s,
                         store_file=store_file, host=host, port=port)
        base = [1 + sum(counts[:w]) for w in range(len(workers))]
        refs = [learner0.join_weight_group.remote(spec)]
        refs += [h.join_weight_group.remote(spec, b) for h, b in zip(workers, base)]
        names = ["learner_0", *(f"rollout_worker_{w}" for w in range(len(workers)))]
        _, failed = _wait_all(refs, names, timeout_s=self._timeout())
        if failed:
            raise WeightSyncFailed(_message("joining the weight-sync group", failed), dead=_dead(failed))
        self.spec, self.builds = spec, self.builds + 1
        log.info("weight-sync group %s: %d members (%s)%s", spec.name[:8], spec.world_size,
                 "file store" if store_file else f"tcp {host}:{port}",
                 f"; rebuild {self.rebuilds} (a failed sync or a replaced member)" if self.rebuilds else "")
        return spec

    def sync(self, learners: Sequence[Any], learner_node_id: str | None, workers: Sequence[Any], version: int) -> int:
        """One broadcast of the current weights as `version`; returns the bytes sent. Raises
        WeightSyncFailed naming the failed members (the group is then forgotten)."""
        self.ensure_group(learners[0], learner_node_id, workers)
        dtype = None if self.cfg.engine.dtype == "auto" else self.cfg.engine.dtype
        adapter = sync_adapter(self.cfg)
        refs = [lw.broadcast_weights.remote(dtype, self.cfg.sync.bucket_mb) for lw in learners]
        refs += [w.receive_weights.remote(version, adapter) for w in workers]
        names = [*(f"learner_{r}" for r in range(len(learners))), *(f"rollout_worker_{w}" for w in range(len(workers)))]
        values, failed = _wait_all(refs, names, timeout_s=self._timeout())
        if failed:
            self.reset()
            raise WeightSyncFailed(_message(f"the weight broadcast of version {version}", failed), dead=_dead(failed))
        return int(values[0])


def sync_adapter(cfg: TrainConfig) -> AdapterSpec | None:
    """The LoRA adapter a sync sends alone (learner.lora without merge_on_sync), else None (full
    weights, merged ones included)."""
    lora = cfg.learner.lora
    return adapter_spec(lora) if lora.enabled and not lora.merge_on_sync else None


def _dead(failed: dict[str, str]) -> list[str]:
    return [name for name, why in failed.items() if why.startswith("the actor died")]


def _message(what: str, failed: dict[str, str]) -> str:
    dead = _dead(failed)
    head = f"{what} failed: " + ("; ".join(f"{n}: {why}" for n, why in failed.items()))
    return head + (f" (dead: {', '.join(dead)})" if dead else "")


def verify_tolerance(cfg: TrainConfig) -> float:
    """sync.verify_tol, or its default by precision (see the field)."""
    if cfg.sync.verify_tol is not None:
        return cfg.sync.verify_tol
    return 1e-4 if cfg.engine.dtype == "float32" and cfg.learner.dtype == "float32" else 0.1


def probe_rows(probes: Sequence[tuple[list[int], Any]]) -> list[TrainRow]:
    """The learner-side rows of the engines' probe samples (prompt ids, Generation)."""
    return [TrainRow(prompt_ids=tuple(p), response_ids=tuple(g.token_ids), sampler_logprobs=tuple(g.logprobs),
                     group_id="sync-probe", traj_id=f"sync-probe-{i}", step_idx=0, episode_score=0.0,
                     action_valid=True)
            for i, (p, g) in enumerate(probes)]


def _token_gaps(rows: Sequence[TrainRow], scores: Sequence[Sequence[float]]) -> list[float]:
    return [abs(a - b) for row, s in zip(rows, scores) for a, b in zip(row.sampler_logprobs, s)]


def max_logprob_gap(rows: Sequence[TrainRow], scores: Sequence[Sequence[float]]) -> float:
    """max |engine - learner| log-prob over every probe token (pure)."""
    return max(_token_gaps(rows, scores), default=0.0)


def probe_gaps(rows: Sequence[TrainRow], scores: Sequence[Sequence[float]]) -> dict[str, float]:
    """The probe's per-step metrics (pure): max and mean |engine - learner| log-prob per token."""
    gaps = _token_gaps(rows, scores)
    return {"probe_max_dlogp": max(gaps, default=0.0), "probe_mean_dlogp": sum(gaps) / len(gaps) if gaps else 0.0}
