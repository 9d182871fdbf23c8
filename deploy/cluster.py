"""`Cluster`: the driver's handle on the running actors, with one method per thing the training
step asks of them (collect, generate UniSkill proposals, train, sync weights, checkpoint). The
training step's Ray calls live here (the skill-bank actor's in `deploy.skillbank_actor`).

Failures (docs/architecture.md "Failures"): every wait is bounded by `ray.call_timeout_s`
(`deploy.recovery.CallTimeout`). A rollout worker that dies is restarted by Ray; the calls it
lost are re-run on it after it has reloaded the current weights (`_recover_worker`), the other
workers' results are kept. A learner rank that dies or stops answering raises
`LearnerGroupFailed`; the trainer then replaces the whole group (`restart_learners`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.colocation import DevicePhases
from deploy.config import TrainConfig
from deploy.dispatch import DynamicCollect, DynamicPending, PendingCalls, collect_chunks, merge_stats
from deploy.elastic import actor_node, kill_unit, reassign_lost, worker_lost
from deploy.recovery import (
    CallTimeout,
    LearnerGroupFailed,
    Recovery,
    gather,
    get_all,
    is_actor_death,
    wait_alive,
)
from deploy.step_rows import StepRows, with_tokens
from deploy.weight_sync import (
    PROBE_TEXT,
    PROBE_TOKENS,
    BroadcastSync,
    WeightSyncFailed,
    max_logprob_gap,
    probe_gaps,
    probe_rows,
    verify_tolerance,
)
from envs.types import TaskSpec
from rollout_workers.types import Generation, RolloutStats, Trajectory, TrajectorySummary

if TYPE_CHECKING:
    from deploy.dispatch import WorkerJob
    from deploy.stages.uniskill_glue import ProposalRequest
    from deploy.topology import LearnerGroup

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0
"""How long a learner rank may take to answer a liveness probe after a failed call."""



@dataclass
class Cluster:
    cfg: TrainConfig
    pools: list
    workers: list
    learner_group: LearnerGroup | None = None
    model_path: str = ""
    policy_version: int = 0
    """The version the engines hold (set by `sync_weights`); a restarted worker reloads it."""
    weights_digest: str | None = None
    """Digest of the weights of the last sync (`rollout_workers.worker.files_digest`)."""
    recoveries: list[Recovery] = field(default_factory=list)
    """Survived failures not yet logged (drained by the trainer into metrics.jsonl)."""
    on_submit: Callable[[str], None] | None = None
    """Called with "collect" / "train" once those calls are in flight (the fault injector's hook)."""
    last_sync: dict[str, float] = field(default_factory=dict)
    """Facts of the last weight sync: seconds; under broadcast fallback (1: it went through the object
    store), bytes (when it did not) and group_rebuilds; probe_max_dlogp and probe_mean_dlogp (with
    sync.verify)."""
    _broadcast: BroadcastSync | None = None
    _dispatch: DynamicCollect | None = None

    def __post_init__(self) -> None:
        self.phases = DevicePhases(self)
        """Which side holds the devices under colocated placement (no-ops otherwise)."""

    @classmethod
    def start(cls, cfg: TrainConfig, model_path: str, *, with_learner: bool = True) -> Cluster:
        from deploy.topology import (
            check_resources,
            init_ray,
            start_env_pools,
            start_learners,
            start_rollout_workers,
        )

        init_ray(cfg)
        check_resources(cfg, with_learner=with_learner)
        pools = start_env_pools(cfg)
        workers = start_rollout_workers(cfg, model_path, pools)
        group = start_learners(cfg, model_path) if with_learner else None
        return cls(cfg=cfg, pools=pools, workers=workers, learner_group=group, model_path=model_path)

    @property
    def learners(self) -> list:
        return self.learner_group.actors if self.learner_group is not None else []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def _timeout_s(self) -> float:
        return self.cfg.ray.call_timeout_s

    def _submitted(self, what: str) -> None:
        if self.on_submit is not None:
            self.on_submit(what)

    def _episodes_per_worker(self) -> int:
        n = len(self.workers)
        return sum(p.num_envs() for i, p in enumerate(self.pools) if i % n == 0)

    # ---- rollout workers ---------------------------------------------------------------------
    def collect(
        self, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int, temperature: float,
        skill_texts: Mapping[str, str | None] | None = None,
        tokens: bool = True,
    ) -> tuple[list[Trajectory] | list[TrajectorySummary], RolloutStats]:
        """Run `group_size` episodes per task across the rollout workers (`submit_collect` +
        `wait_collect`, which the pipelined driver calls apart); `skill_texts` (UniSkill): task_id ->
        the skill in that task's actor prompts. A dead worker's chunks are collected again, whole,
        on the restarted worker (same tasks, current weights); the others' are kept. With `tokens`
        off the episodes come as summaries, their token arrays left in the object store (what an
        evaluation reads)."""
        pending = self.submit_collect(tasks, group_size=group_size, policy_version=policy_version,
                                      temperature=temperature, skill_texts=skill_texts)
        summaries, stats = self.wait_collect(pending)
        return (with_tokens(summaries, pending.result_refs()) if tokens else summaries), stats

    def submit_collect(
        self, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int, temperature: float,
        skill_texts: Mapping[str, str | None] | None = None,
    ) -> PendingCalls:
        """Put `collect`'s calls in the workers' queues and return at once (`deploy.pipeline`);
        with rollout.assignment=dynamic the workers take groups from a queue instead (`deploy.dispatch`)."""
        if self.cfg.rollout.assignment == "dynamic":
            self._dispatch = self._dispatch or DynamicCollect(self)
            pending = self._dispatch.submit(tasks, group_size=group_size, policy_version=policy_version,
                                            temperature=temperature, skill_texts=skill_texts)
            self._submitted("collect")
            return pending
        per_call = max(1, self._episodes_per_worker() // group_size)
        jobs, tokens = collect_chunks(tasks, len(self.workers), per_call, group_size=group_size,
                                      policy_version=policy_version, temperature=temperature, skill_texts=skill_texts)
        pending = self._submit_jobs(jobs, what="collect")
        pending.tokens = tokens
        return pending

    def wait_collect(self, pending: PendingCalls | DynamicPending) -> tuple[list[TrajectorySummary], RolloutStats]:
        """The episodes' summaries (their token arrays stay in the object store: `pending.result_refs()`,
        `deploy.step_rows`) and the merged stats of a `submit_collect` (wall time from submission)."""
        if isinstance(pending, DynamicPending):
            return self._dispatch.wait(pending)
        results = self._finish_jobs(pending)
        summaries = [t for trajs, _ in results for t in trajs]
        return summaries, merge_stats([s for _, s in results], time.perf_counter() - pending.start)

    def wait_finished(self, pending: PendingCalls | DynamicPending) -> None:
        """Block until every call of `pending` has finished (or failed), without fetching results;
        bounded by ray.call_timeout_s (a later `wait_collect` reports a call still unanswered)."""
        import ray

        if isinstance(pending, DynamicPending):
            return self._dispatch.wait_finished(pending)
        ray.wait(list(pending.refs), num_returns=len(pending.refs), timeout=self._timeout_s, fetch_local=False)

    def generate_proposals(self, requests: Sequence[ProposalRequest]) -> list[list[Generation]]:
        """UniSkill proposals with the current weights: requests[i] on rollout worker i, all at
        once (`deploy.stages.uniskill_glue.ProposalWorkers`)."""
        if len(requests) > len(self.workers):
            raise ValueError(f"{len(requests)} proposal requests for {len(self.workers)} rollout workers")

        def job(r: ProposalRequest) -> Callable[[Any], Any]:
            return lambda w: w.generate_proposals.remote(r.prompt_ids, max_tokens=r.max_tokens, temperature=r.temperature,
                                                         seed=r.seed, op_choices=r.op_choices)

        return self._on_workers([(i, job(r)) for i, r in enumerate(requests)], what="generate_proposals")

    def _on_workers(self, jobs: Sequence[WorkerJob], *, what: str) -> list:
        """Run every job on its worker and return the results in order. Jobs whose worker died are
        submitted again once the worker is back with the current weights; any other failure, or a
        call unanswered for ray.call_timeout_s, raises."""
        return self._finish_jobs(self._submit_jobs(jobs, what=what))

    def _submit_jobs(self, jobs: Sequence[WorkerJob], *, what: str) -> PendingCalls:
        handles = [self.workers[w] for w, _ in jobs]
        refs = [submit(h) for h, (_, submit) in zip(handles, jobs)]
        self._submitted(what)
        return PendingCalls(list(jobs), refs, what, handles=handles)

    def _finish_jobs(self, pending: PendingCalls) -> list:
        jobs, refs, what = pending.jobs, pending.refs, pending.what
        handles = pending.handles or [self.workers[w] for w, _ in jobs]
        results: dict[int, Any] = {}
        todo = list(range(len(jobs)))
        while todo:
            died: dict[int, tuple[BaseException, int]] = {}
            failed: list[int] = []
            for j, ref, (value, err) in zip(todo, refs, gather(refs, timeout_s=self._timeout_s, what=f"rollout {what}")):
                if err is None:
                    results[j], pending.stored[j] = value, ref
                    continue
                failed.append(j)
                w = self._worker_index(handles[j])
                if w is not None:  # None: removed meanwhile (its node left); re-run on the survivors below
                    died[w] = (err, died.get(w, (err, 0))[1] + 1)
            lost = {w: n for w, (_, n) in died.items() if self._worker_lost(w)}
            for w, (err, n) in died.items():
                if w not in lost:
                    self._recover_worker(w, err, lost_calls=n, what=what)
            self.remove_workers(sorted(lost), reason=f"its node left during {what}", lost_calls=lost)
            todo = failed
            owners = reassign_lost([self._worker_index(handles[j]) for j in todo], len(self.workers))
            for j, w in zip(todo, owners):
                handles[j] = self.workers[w]
            refs = [jobs[j][1](handles[j]) for j in todo]
        return [results[j] for j in range(len(jobs))]

    def _recover_worker(self, w: int, err: BaseException, *, lost_calls: int, what: str) -> None:
        """Wait for Ray to restart worker `w`, then bring it to the current weights (`_make_current`)."""
        name = f"rollout_worker_{w}"
        log.warning("%s died during %s (%s); waiting for Ray to restart it", name, what, type(err).__name__)
        start = time.perf_counter()
        handle = self.workers[w]
        wait_alive(lambda: handle.policy_version.remote(), timeout_s=self._timeout_s, what=f"{name} restart")
        if self._broadcast is not None:
            self._broadcast.reset()  # a new process: the weight-sync group is rebuilt at the next sync
        facts = {"lost_calls": float(lost_calls), **self._make_current(handle, name)}
        self.recoveries.append(Recovery("rollout_worker", name, time.perf_counter() - start, facts))
        log.warning("%s is back at policy version %d; re-running its %d lost %s call(s)", name, self.policy_version,
                    lost_calls, what)

    def _make_current(self, handle: Any, name: str) -> dict[str, float]:
        """Load the weights of `self.policy_version` into a (re)started worker (exported again by the
        learners, unless this cluster has none: then the worker's own model is the policy) and
        check it holds them exactly: the digest of the files it loaded equals the one the learner
        computed when it exported them (a log-prob probe cannot tell: bf16 engines and learners
        differ by 0.1-0.5 nats on single tokens with equal weights), and the same version."""
        facts: dict[str, float] = {}
        if self.learners:
            files_ref, want = self._export()
            [digest] = get_all([handle.load_weight_files.remote(files_ref, self.policy_version)],
                               timeout_s=self._timeout_s, what=f"{name} weight reload")
            if digest != want:
                raise RuntimeError(f"{name} restarted with weights that differ from the policy's "
                                   f"version {self.policy_version} (digest {digest[:12]} != {want[:12]})")
            facts["weights_current"] = 1.0
        [version] = get_all([handle.policy_version.remote()], timeout_s=self._timeout_s, what=f"{name} version")
        if version != self.policy_version:
            raise RuntimeError(f"{name} restarted at policy version {version}, not {self.policy_version}")
        facts["policy_version"] = float(version)
        return facts

    # ---- elastic membership (rollout.num_workers=auto, `deploy.elastic`) -------------------------
    def _worker_index(self, handle: Any) -> int | None:
        return next((i for i, h in enumerate(self.workers) if h is handle), None)

    def _worker_lost(self, w: int) -> bool:
        """With rollout.num_workers=auto, a dead worker whose node left is removed, not awaited."""
        return self.cfg.rollout.num_workers == "auto" and worker_lost(self.workers[w])

    def add_workers(self, workers: Sequence[Any], pools: Sequence[Sequence[Any]]) -> int:
        """Join started workers (pools[i]: workers[i]'s env pools) once each holds the current
        policy version (`_make_current`); a worker that fails to start is killed with its pools
        and skipped. The weight-sync group is rebuilt at the next sync. Returns how many joined."""
        joined = 0
        for handle, mine in zip(workers, pools):
            name = actor_node(handle)[2] or "new rollout worker"
            try:
                wait_alive(lambda h=handle: h.policy_version.remote(), timeout_s=self._timeout_s, what=f"{name} start")
                self._make_current(handle, name)
            except LearnerGroupFailed:  # exporting the weights failed: the trainer replaces the group
                kill_unit(handle, mine)
                raise
            except Exception as err:  # noqa: BLE001 - the run goes on with the workers it has
                log.warning("%s did not start (%s: %s); continuing without it", name, type(err).__name__, err)
                kill_unit(handle, mine)
                continue
            self.workers.append(handle)
            self.pools.extend(mine)
            joined += 1
        if joined and self._broadcast is not None:
            self._broadcast.reset()
        return joined

    def remove_workers(self, indices: Sequence[int], *, reason: str, lost_calls: Mapping[int, int] | None = None) -> int:
        """Kill rollout workers `indices` (no restart) with their env pools (with num_workers=auto
        worker k owns pools[k*P:(k+1)*P], P = ray.env_pools) and drop them from the cluster; each is
        a Recovery. The weight-sync group is rebuilt at the next sync. Raises when none is left."""
        per, start = self.cfg.ray.env_pools, time.perf_counter()
        for w in sorted(indices, reverse=True):
            handle = self.workers.pop(w)
            name = actor_node(handle)[2] or f"rollout worker #{w}"
            mine, self.pools[w * per:(w + 1) * per] = self.pools[w * per:(w + 1) * per], []
            kill_unit(handle, mine)
            lost = (lost_calls or {}).get(w, 0)
            log.warning("%s removed (%s); %d call(s) it lost re-run on the %d surviving worker(s)",
                        name, reason, lost, len(self.workers))
            self.recoveries.append(Recovery("rollout_worker", name, time.perf_counter() - start,
                                            {"workers_removed": 1.0, "reassigned_calls": float(lost)}))
        if indices and not self.workers:
            raise RuntimeError(f"every rollout worker is gone ({reason}); add a node with room for one")
        if indices and self._broadcast is not None:
            self._broadcast.reset()
        return len(indices)

    # ---- learners ----------------------------------------------------------------------------
    def _on_learners(self, submit: Callable[[Any], Any], *, what: str) -> list:
        """`submit(rank)` on every rank; results in rank order. A dead or silent rank raises
        LearnerGroupFailed (the group cannot continue without it)."""
        refs = [submit(lw) for lw in self.learners]
        self._submitted(what)
        return self._learner_results(refs, what=what)

    def _learner_results(self, refs: Sequence[Any], *, what: str) -> list:
        try:
            return get_all(refs, timeout_s=self._timeout_s, what=f"learner {what}")
        except CallTimeout as err:
            raise LearnerGroupFailed(str(err)) from err
        except Exception as err:
            if is_actor_death(err) or self._dead_ranks():
                raise LearnerGroupFailed(f"learner {what}: a rank died ({type(err).__name__}: "
                                         f"{str(err).splitlines()[0] if str(err) else ''})") from err
            raise

    def _dead_ranks(self) -> list[int]:
        """Ranks that do not answer a probe (dead, or stuck in a collective)."""
        dead = []
        for rank, lw in enumerate(self.learners):
            try:
                get_all([lw.get_version.remote()], timeout_s=PROBE_TIMEOUT_S, what=f"learner rank {rank} probe")
            except Exception as err:  # noqa: BLE001 - any failure to answer means the rank is unusable
                log.warning("learner rank %d does not answer: %s", rank, type(err).__name__)
                dead.append(rank)
        return dead

    def train(self, rows: StepRows | Sequence, proposals: Sequence = (), align: Sequence = (), *,
              proposer_warmup: bool = False):
        """One learner update. Every rank gets ALL rows (advantages need whole groups; each rank
        trains on its strided share) and all UniSkill proposal rows / R_align requests (whitened
        over the global batch); returns rank 0's StepMetrics. `StepRows`: each rank fetches the
        step's trajectories from the object store and builds the rows itself (`deploy.step_rows`)."""
        import ray

        refs = [ray.put(list(x)) for x in (proposals, align)]
        if isinstance(rows, StepRows):
            step = ray.put(rows)
            return self._on_learners(lambda lw: lw.train_stored.remote(step, *refs, proposer_warmup=proposer_warmup),
                                     what="train")[0]
        rows_ref = ray.put(list(rows))
        return self._on_learners(lambda lw: lw.train_step.remote(rows_ref, *refs, proposer_warmup=proposer_warmup),
                                 what="train")[0]

    def _export(self) -> tuple[Any, str]:
        """Every rank takes part (ZeRO-3 gathers shards); rank 0's files are the weights. Returns
        the reference to rank 0's files (they stay in the object store) and their digest, once
        every rank has finished."""
        pairs = [lw.export_weight_files.options(num_returns=2).remote() for lw in self.learners]
        digests = self._learner_results([digest for _, digest in pairs], what="weight export")
        return pairs[0][0], digests[0]

    def sync_weights(self, version: int) -> None:
        """Make every engine hold the learners' current weights as `version` (`sync.method`):
        broadcast over the weight-sync group (no files, no digest), or through the object store.
        A failed broadcast names the members concerned and raises LearnerGroupFailed when a
        learner rank died; when only rollout workers failed, this sync falls back to the object
        store (which restarts and reloads dead workers) and the next one rebuilds the group.
        With sync.verify, the log-prob probe is measured after every sync (`probe_weights`)."""
        start = time.perf_counter()
        self.last_sync = {}
        if self.cfg.sync.method == "broadcast":
            self._sync_broadcast(version)
        elif self.cfg.sync.method == "handover":  # colocated: in place, on each engine's own devices
            self.last_sync["bytes"] = float(self.phases.handover(version))
        else:
            self._sync_object_store(version)
        self.last_sync["seconds"] = time.perf_counter() - start
        if self.cfg.sync.verify:
            self.last_sync.update(self.probe_weights())

    def _sync_broadcast(self, version: int) -> None:
        if self._broadcast is None:
            self._broadcast = BroadcastSync(self.cfg)
        node = getattr(self.learner_group, "node_id", None)
        self.policy_version, self.weights_digest = version, None
        try:
            self.last_sync["bytes"] = float(self._broadcast.sync(self.learners, node, self.workers, version))
            self.last_sync["fallback"] = 0.0
        except WeightSyncFailed as err:
            if any(name.startswith("learner_") for name in err.dead) or self._dead_ranks():
                raise LearnerGroupFailed(str(err)) from err
            log.warning("%s; this sync goes through the object store instead", err)
            self.last_sync["fallback"] = 1.0
            self._sync_object_store(version)
        finally:
            self.last_sync["group_rebuilds"] = float(self._broadcast.rebuilds)

    def probe_weights(self) -> dict[str, float]:
        """A measurement, not a gate: each engine continues a fixed probe at the learner's
        temperature and every learner rank re-scores the samples; returns the max and mean
        |engine - learner| log-prob (`probe_max_dlogp`, `probe_mean_dlogp`). Above sync.verify_tol
        it logs a warning naming the workers; whether an engine holds the policy's weights is
        decided by exact checks (the export digest), since bf16 engines and learners differ by
        0.1-0.5 nats on single tokens with equal weights."""
        temp = self.cfg.learner.temperature
        workers = list(range(len(self.workers)))
        probes = self._on_workers([(w, lambda h: h.probe.remote(PROBE_TEXT, max_tokens=PROBE_TOKENS, temperature=temp,
                                                                 seed=self.policy_version))
                                   for w in workers], what="sync probe")
        rows = probe_rows(probes)
        scores = self._on_learners(lambda lw: lw.score.remote(rows), what="sync probe score")[0]
        tol = verify_tolerance(self.cfg)
        worst = {w: max_logprob_gap([row], [score]) for w, row, score in zip(workers, rows, scores)}
        over = [f"rollout_worker_{w} ({gap:.3g})" for w, gap in worst.items() if gap > tol]
        if over:
            log.warning("sync probe at policy version %d: |engine - learner| log-prob above sync.verify_tol=%g on %s",
                        self.policy_version, tol, ", ".join(over))
        return probe_gaps(rows, scores)

    def verify_weights(self) -> float:
        """`probe_weights`' max |engine - learner| log-prob (the figure the weight-sync bench reports)."""
        return self.probe_weights()["probe_max_dlogp"]

    def _sync_object_store(self, version: int) -> None:
        """Rank 0's exported bytes travel through the object store to every engine's node."""
        files_ref, want = self._export()
        self.policy_version, self.weights_digest = version, None  # a worker restarted meanwhile loads these
        digests = self._on_workers([(w, lambda h: h.load_weight_files.remote(files_ref, version))
                                    for w in range(len(self.workers))], what="weight sync")
        if any(d != want for d in digests):
            raise RuntimeError(f"rollout workers hold weights other than the learner's after the sync to version {version}")
        self.weights_digest = want

    def export_hf(self, out_dir: str | Path, *, adapter: bool = False) -> Path:
        """Write the current policy as an HF directory at `out_dir`, from the learner ranks themselves
        (`LearnerWorker.export_weights`: module by module under ZeRO-3, rank 0 writes): on a cluster
        `out_dir` lies under run.output_dir on shared storage, and no weights pass through the driver.
        `adapter` (LoRA): the peft adapter directory instead (`LearnerWorker.export_adapter`)."""
        out = Path(out_dir)
        self._on_learners(lambda lw: (lw.export_adapter if adapter else lw.export_weights).remote(str(out)),
                          what="export_hf")
        return out

    def load_adapter(self, adapter_dir: str | Path, version: int) -> None:
        """Apply the peft adapter directory `adapter_dir` (the driver's) in every engine as `version`."""
        import ray

        files = ray.put({p.name: p.read_bytes() for p in Path(adapter_dir).iterdir() if p.is_file()})
        self._on_workers([(w, lambda h: h.load_weight_files.remote(files, version)) for w in range(len(self.workers))],
                         what="adapter load")

    def save_checkpoint(self, ckpt_dir: str | Path) -> None:
        self._on_learners(lambda lw: lw.save_checkpoint.remote(str(ckpt_dir)), what="save_checkpoint")

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        self._on_learners(lambda lw: lw.load_checkpoint.remote(str(ckpt_dir)), what="load_checkpoint")

    def restart_learners(self) -> None:
        """Replace the learner group: kill every rank, release its placement group, and start a new
        group (new rendezvous file) from the run's model; the trainer then loads a checkpoint."""
        from deploy.topology import start_learners, stop_learners

        if self.learner_group is not None:
            stop_learners(self.learner_group)
            self.learner_group = None
        if self._broadcast is not None:
            self._broadcast.reset()
        self.learner_group = start_learners(self.cfg, self.model_path)

    def drain_recoveries(self) -> list[Recovery]:
        out, self.recoveries = self.recoveries, []
        return out

    def shutdown(self) -> None:
        import ray

        from deploy.topology import remove_rollout_placements

        # Engines first stop themselves (vLLM's engine core, its rendezvous files); a worker that
        # does not answer in time is killed all the same.
        ray.wait([w.shutdown.remote() for w in self.workers], num_returns=len(self.workers), timeout=30)
        for handle in [*self.workers, *(p.handle for p in self.pools)]:
            ray.kill(handle)
        remove_rollout_placements()
        if self.learner_group is not None:
            from deploy.topology import stop_learners

            stop_learners(self.learner_group)
            self.learner_group = None
