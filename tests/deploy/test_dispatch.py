"""Dynamic episode assignment on a real local Ray cluster (`deploy.dispatch`): three rollout
workers (simulated engine, household envs in-process) take task groups from the queue actor; one
worker's process dies at its first env step, its groups go back to the queue and the survivors
play them, Ray restarts it and the driver brings it back. Every group comes back exactly once, in
task order, and the learners' view of the step (`deploy.step_rows.StepRows`, fetched by another
process from the object store) is the driver's. The queue's bookkeeping is checked without Ray."""

from __future__ import annotations

import pytest

from deploy.actors import InProcessEnvPool
from deploy.cluster import Cluster
from deploy.config_loading import load_config
from deploy.dispatch import DynamicPending, TaskQueue
from deploy.step_rows import StepRows
from envs.config import EnvConfig
from envs.faults import ProcessExitFactory
from envs.tasks import sample_tasks
from rollout_workers.summaries import summary
from rollout_workers.task_source import TaskUnit

ENV = EnvConfig(max_steps=5)


def _unit(i: int) -> TaskUnit:
    return TaskUnit(i, sample_tasks(ENV, "train", 1, seed=i)[0], seed=i)


def test_queue_hands_out_and_requeues_what_a_dead_worker_took():
    q = TaskQueue()
    q.load(0, [_unit(i) for i in range(4)])
    q.load(1, [_unit(9)])  # another collect (an evaluation) keeps its own units
    a, b, a2 = q.take(0, "a"), q.take(0, "b"), q.take(0, "a")
    assert (a.index, b.index, a2.index) == (0, 1, 2) and q.pending(0) == 1
    q.finish(0, "a", 0)
    assert q.requeue(0, "a") == 2  # played or not: a's groups were to come back with its call
    assert [q.take(0, "c").index, q.take(0, "c").index, q.take(0, "c").index, q.take(0, "c")] == [0, 2, 3, None]
    assert q.requeue(0, "b") == 1 and q.take(0, "c").index == 1
    assert q.take(1, "a").index == 9 and q.take(1, "a") is None
    q.release(0)
    assert q.pending(0) == 0 and q.take(0, "a") is None


@pytest.mark.ray
@pytest.mark.slow
def test_a_worker_dying_mid_collect_loses_no_group(tmp_path):
    import ray

    from rollout_workers.worker import RolloutWorker

    cfg = load_config(None, ["engine.engine=simulated", "engine.simulated_time_scale=0.02",
                             "engine.simulated_response_tokens=40", "rollout.loop=async", "rollout.assignment=dynamic",
                             "rollout.num_workers=3", "ray.env_pools=3", "rollout.use_think=false", "rollout.constrained_actions=true",
                             "rollout.max_response_tokens=128", "rollout.max_prompt_tokens=100000",
                             "ray.call_timeout_s=120", f"run.output_dir={tmp_path}/run"])
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test_dispatch", log_to_driver=False)
    try:
        cls = ray.remote(RolloutWorker).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        faulty = ProcessExitFactory(marker=str(tmp_path / "exited"))
        pools = [InProcessEnvPool(ENV, 4, env_factory=faulty if w == 0 else None) for w in range(3)]
        workers = [cls.remote(cfg.engine, cfg.rollout, "", [p]) for p in pools]
        ray.get([w.policy_version.remote() for w in workers])  # all up: each takes groups from the start
        cluster = Cluster(cfg=cfg, pools=pools, workers=workers)
        tasks = sample_tasks(ENV, "train", 12, seed=5)
        pending = cluster.submit_collect(tasks, group_size=2, policy_version=0, temperature=1.0)
        assert isinstance(pending, DynamicPending)
        trajectories, stats = cluster.wait_collect(pending)
        assert (tmp_path / "exited").exists() and pending.killed == 1 and pending.requeued >= 1
        assert [t.task for t in trajectories] == [t for t in tasks for _ in range(2)]
        assert len({t.group_id for t in trajectories}) == 12 and stats.num_episodes >= 24
        assert [r.component for r in cluster.drain_recoveries()] == ["rollout_worker"]
        assert ray.get(workers[0].policy_version.remote()) == 0  # restarted and usable again

        assert len(pending.result_refs()) >= 2  # the calls that returned (the dead worker's did not)
        step = StepRows.of(pending.result_refs(), trajectories[2:], None, gamma=1.0)
        fetched = ray.get(ray.remote(lambda s: s.trajectories()).options(num_cpus=0).remote(step))
        assert not hasattr(trajectories[0].turns[0], "response_ids")  # the driver held summaries only
        assert [summary(t) for t in fetched] == trajectories and all(t.turns[0].response_ids for t in fetched)
        assert len(step.rows(fetched)) == sum(len(t.turns) for t in trajectories[2:] if t.turns)
    finally:
        ray.shutdown()
