"""Ray-side adapters around the plain worker classes. Only `deploy` knows about Ray.

- `RemoteEnvPool` makes an EnvPool actor look like a local EnvPool (the `EnvPoolClient` shape the
  rollout loop expects). A dead actor (crash, OOM, `ray.kill`) is survived: the slots of the failed
  call come back as done with `env_error` set, and the actor is restarted by Ray
  (`max_restarts=-1`) for the next reset.
- `LearnerActor` adds `export_weight_files`: the exported HF directory as bytes, so weights travel
  through the Ray object store to each engine's node (no shared filesystem needed); and
  `train_stored`: the step's rows built on the rank from trajectories it fetches itself. Ranks are not
  restarted by Ray: a group that lost a rank is replaced as a whole (`deploy.topology`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from deploy.step_rows import StepRows
from envs.types import EnvStep, TaskSpec
from learner.colocation import ColocatedLearner
from learner.worker import LearnerWorker
from rollout_workers.worker import files_digest

RESET_ATTEMPTS = 12
RESET_BACKOFF_S = 0.5


class RemoteEnvPool:
    """EnvPoolClient over a Ray actor handle; converts actor death into env_error steps.

    With `namespace` (a named actor: `name` in that Ray namespace) a pickled copy carries the
    name, not the handle, and looks the actor up where it is used: a rollout worker built with it
    then has no actor handle among its constructor arguments, which Ray needs to restart it safely."""

    def __init__(self, handle, num_envs: int, name: str, *, namespace: str | None = None):
        self._handle = handle
        self._num_envs = num_envs
        self.name = name
        self.namespace = namespace
        self.actor_failures = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.namespace is not None:
            state["_handle"] = None
        return state

    @property
    def handle(self):
        """The EnvPool actor handle (for shutdown and inspection)."""
        if self._handle is None:
            import ray

            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle

    def num_envs(self) -> int:
        return self._num_envs

    def reset(self, slots: list[int], tasks: list[TaskSpec]) -> list[EnvStep]:
        # A reset starts from scratch, so it may wait for a restarting actor; a step may not.
        return self._call("reset", slots, tasks, attempts=RESET_ATTEMPTS)

    def step(self, slots: list[int], actions: list[str]) -> list[EnvStep]:
        return self._call("step", slots, actions, attempts=1)

    def _call(self, method: str, slots: list[int], payload: list, *, attempts: int) -> list[EnvStep]:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        for attempt in range(attempts):
            try:
                return ray.get(getattr(self.handle, method).remote(slots, payload))
            except (RayActorError, ActorUnavailableError) as err:
                failure = err
                if attempt + 1 < attempts:
                    time.sleep(min(RESET_BACKOFF_S * (attempt + 1), 3.0))
        self.actor_failures += 1
        reason = f"EnvPool actor {self.name} failed during {method}: {type(failure).__name__}"
        return [
            EnvStep(observation="", admissible_actions=(), reward=0.0, done=True, won=False, env_error=reason)
            for _ in slots
        ]


class InProcessEnvPool:
    """An EnvPool built inside the process that uses it, on first use (a pickled copy carries only
    the config): a rollout worker with its environments in-process and no EnvPool actor (the
    simulated cluster, bench/sim_cluster.py). It dies with its worker."""

    handle = None  # no actor of its own (`deploy.elastic.kill_unit` skips it)

    def __init__(self, cfg, num_envs: int, env_factory=None) -> None:
        self.cfg, self.n, self.env_factory, self._pool = cfg, num_envs, env_factory, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}

    def _local(self):
        if self._pool is None:
            from envs.pool import EnvPool

            extra = {} if self.env_factory is None else {"env_factory": self.env_factory}
            self._pool = EnvPool(self.cfg, self.n, **extra)
        return self._pool

    def num_envs(self) -> int:
        return self.n

    def reset(self, slots: list[int], tasks: list[TaskSpec]) -> list[EnvStep]:
        return self._local().reset(slots, tasks)

    def step(self, slots: list[int], actions: list[str]) -> list[EnvStep]:
        return self._local().step(slots, actions)


class LearnerActor(ColocatedLearner, LearnerWorker):
    """LearnerWorker plus byte-level weight export for cross-node sync."""

    def export_weight_files(self) -> tuple[dict[str, bytes], str]:
        """(files, their digest): called with `num_returns=2`, so the driver can wait on the small
        digest (and see a failure) without pulling the weights to its node. The digest
        (`files_digest`, computed once here) is what an engine that loads these files reports
        back: equal digests mean the engine holds exactly these weights."""
        with tempfile.TemporaryDirectory(prefix="agentrl-export-") as tmp:
            self.export_sync(tmp)  # the HF directory, or with LoRA the adapter directory alone
            files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
        return files, files_digest(files)

    def train_stored(self, step: StepRows, proposals=(), align=(), *, proposer_warmup: bool = False):
        """`train_step` on the rows this rank builds from the step's trajectories, fetched from the
        object store (`deploy.step_rows`): the token arrays of the episodes it holds only
        (`StepRows.shard`); each rank archives the episodes it holds and rank 0 merges the parts
        after the update, when the step asks. UniSkill's proposals, whose passes read every row:
        every episode, and rank 0 archives them all."""
        if proposals:
            trajectories = step.trajectories()
            if self.rank == 0:
                step.write_archive(trajectories)
            rows = step.rows(trajectories, self.tokenizer, rank=self.rank, world_size=self.world_size)
            return self.train_step(rows, proposals, align, proposer_warmup=proposer_warmup)
        shard = step.shard(self.tokenizer, rank=self.rank, world_size=self.world_size)
        step.archive_part(shard, rank=self.rank, world_size=self.world_size)
        metrics = self.train_step(shard.rows, align=align, proposer_warmup=proposer_warmup, owners=shard.owners)
        if self.rank == 0:
            step.merge_archive(shard, world_size=self.world_size)
        return metrics
