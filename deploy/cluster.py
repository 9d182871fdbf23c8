"""`Cluster`: the driver's handle on the running actors, with one method per thing the training
step asks of them (collect, generate UniSkill proposals, train, sync weights, checkpoint). The
training step's Ray calls live here (the skill-bank actor's in `deploy.skillbank_actor`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.config import TrainConfig
from envs.types import TaskSpec
from rollout_workers.types import Generation, RolloutStats, Trajectory

if TYPE_CHECKING:
    from deploy.stages.uniskill_glue import ProposalRequest


def merge_stats(stats: Sequence[RolloutStats], wall_s: float) -> RolloutStats:
    return RolloutStats(
        num_episodes=sum(s.num_episodes for s in stats),
        num_turns=sum(s.num_turns for s in stats),
        num_generated_tokens=sum(s.num_generated_tokens for s in stats),
        num_prompt_tokens=sum(s.num_prompt_tokens for s in stats),
        generate_s=sum(s.generate_s for s in stats),
        env_s=sum(s.env_s for s in stats),
        total_s=wall_s,
    )


@dataclass
class Cluster:
    cfg: TrainConfig
    pools: list
    workers: list
    learners: list = field(default_factory=list)
    learner_group: object | None = None

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
        learners, group = start_learners(cfg, model_path) if with_learner else ([], None)
        return cls(cfg=cfg, pools=pools, workers=workers, learners=learners, learner_group=group)

    def _episodes_per_worker(self) -> int:
        n = len(self.workers)
        return sum(p.num_envs() for i, p in enumerate(self.pools) if i % n == 0)

    def collect(
        self, tasks: Sequence[TaskSpec], *, group_size: int, policy_version: int, temperature: float,
        skill_texts: Mapping[str, str | None] | None = None,
    ) -> tuple[list[Trajectory], RolloutStats]:
        """Run `group_size` episodes per task across the rollout workers (chunked to env capacity);
        `skill_texts` (UniSkill) maps task_id -> the skill shown in that task's actor prompts."""
        import ray

        start = time.perf_counter()
        per_call = max(1, self._episodes_per_worker() // group_size)
        futures = []
        for w, worker in enumerate(self.workers):
            share = list(tasks[w :: len(self.workers)])
            for i in range(0, len(share), per_call):
                futures.append(worker.collect.remote(
                    share[i : i + per_call], group_size=group_size,
                    policy_version=policy_version, temperature=temperature,
                    skill_texts={t.task_id: skill_texts.get(t.task_id) for t in share[i : i + per_call]}
                    if skill_texts else None))
        results = ray.get(futures)
        trajectories = [t for trajs, _ in results for t in trajs]
        return trajectories, merge_stats([s for _, s in results], time.perf_counter() - start)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def generate_proposals(self, requests: Sequence[ProposalRequest]) -> list[list[Generation]]:
        """UniSkill proposals with the current weights: requests[i] on rollout worker i, all at
        once (`deploy.stages.uniskill_glue.ProposalWorkers`)."""
        import ray

        if len(requests) > len(self.workers):
            raise ValueError(f"{len(requests)} proposal requests for {len(self.workers)} rollout workers")
        return ray.get([
            w.generate_proposals.remote(r.prompt_ids, max_tokens=r.max_tokens, temperature=r.temperature,
                                        seed=r.seed, op_choices=r.op_choices)
            for w, r in zip(self.workers, requests)])

    def train(self, rows: Sequence, proposals: Sequence = (), align: Sequence = (), *,
              proposer_warmup: bool = False):
        """One learner update. Every rank gets ALL rows (advantages need whole groups; each rank
        trains on its strided share) and all UniSkill proposal rows / R_align requests (whitened
        over the global batch); returns rank 0's StepMetrics."""
        import ray

        refs = [ray.put(list(x)) for x in (rows, proposals, align)]
        return ray.get([lw.train_step.remote(*refs, proposer_warmup=proposer_warmup) for lw in self.learners])[0]

    def _export(self):
        """Every rank takes part (ZeRO-3 gathers shards); rank 0's files are the weights."""
        refs = [lw.export_weight_files.remote() for lw in self.learners]
        return refs[0], refs[1:]

    def sync_weights(self, version: int) -> None:
        """Rank 0's exported bytes travel through the object store to every engine's node."""
        import ray

        files_ref, others = self._export()
        ray.get([w.load_weight_files.remote(files_ref, version) for w in self.workers] + others)

    def export_hf(self, out_dir: str | Path) -> Path:
        """Write the current policy as an HF directory on the driver's filesystem."""
        import ray

        files_ref, others = self._export()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in ray.get(files_ref).items():
            (out / name).write_bytes(data)
        ray.get(others)
        return out

    def save_checkpoint(self, ckpt_dir: str | Path) -> None:
        import ray

        ray.get([lw.save_checkpoint.remote(str(ckpt_dir)) for lw in self.learners])

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        import ray

        ray.get([lw.load_checkpoint.remote(str(ckpt_dir)) for lw in self.learners])

    def shutdown(self) -> None:
        import ray

        for handle in [*self.workers, *self.learners, *(p.handle for p in self.pools)]:
            ray.kill(handle)
        if self.learner_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.learner_group)
