"""Ray plumbing on a real local cluster (num_cpus=2): an EnvPool actor whose process dies mid-
episode is restarted by Ray, the episodes it hosted end with end_reason="env_error" and are
counted, the other pool's episodes are unaffected, and later collections run normally, also after
a hard `ray.kill` of the actor."""

import pytest

from deploy.actors import RemoteEnvPool
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.metrics import rollout_metrics
from envs.config import EnvConfig
from envs.faults import ProcessExitFactory
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.worker import RolloutWorker

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test_plumbing")
    yield ray
    ray.shutdown()


def _wait_restarted(ray, handle, timeout_s: float = 60.0) -> None:
    import time

    time.sleep(1.0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(handle.num_envs.remote(), timeout=10)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_env_pool_actor_crash_is_survived_and_counted(ray_cluster, tmp_path):
    ray = ray_cluster
    env_cfg = EnvConfig(max_steps=6)
    model = build_tiny_model(tmp_path / "model", ["go to desk 1", "look", "inventory"] * 20, TINY)
    marker = tmp_path / "exited"
    healthy = ray.remote(EnvPool).options(max_restarts=-1, num_cpus=0.25).remote(env_cfg, 4)
    flaky = ray.remote(EnvPool).options(max_restarts=-1, max_task_retries=0, num_cpus=0.25).remote(
        env_cfg, 4, env_factory=ProcessExitFactory(marker=str(marker)))  # dies at its first step
    pools = [RemoteEnvPool(healthy, 4, "healthy"), RemoteEnvPool(flaky, 4, "flaky")]
    rollout = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, group_size=4)
    worker = RolloutWorker(EngineConfig(engine="hf"), rollout, str(model), pools)
    tasks = eval_tasks(env_cfg, "valid_unseen", 2)  # task 0 -> healthy pool, task 1 -> flaky pool

    trajs, _ = worker.collect(tasks, group_size=4, policy_version=0, temperature=1.0)
    assert marker.exists(), "the flaky actor's process did not exit"
    by_task = {t.task_id: [x for x in trajs if x.task.task_id == t.task_id] for t in tasks}
    assert [x.end_reason for x in by_task[tasks[1].task_id]] == ["env_error"] * 4
    assert all(x.end_reason in ("won", "step_limit") for x in by_task[tasks[0].task_id])
    assert rollout_metrics(trajs)["episodes_env_error"] == 4.0
    assert pools[1].actor_failures == 1

    trajs, _ = worker.collect(tasks, group_size=4, policy_version=0, temperature=1.0)
    assert len(trajs) == 8 and all(x.end_reason in ("won", "step_limit") for x in trajs), [
        (x.task.task_id, x.end_reason) for x in trajs]

    ray.kill(flaky, no_restart=False)  # as an operator or the OOM killer would
    _wait_restarted(ray, flaky)  # ray.kill is asynchronous: let the old process die first
    trajs, _ = worker.collect(tasks, group_size=4, policy_version=0, temperature=1.0)
    assert len(trajs) == 8 and all(x.end_reason in ("won", "step_limit") for x in trajs)


def test_unschedulable_topology_fails_fast_naming_the_knobs(ray_cluster):
    from deploy.config_loading import load_config
    from deploy.topology import check_resources

    cfg = load_config(None, ["ray.learner_cpus=8"])
    check_resources(cfg, with_learner=False)  # rollout + env pools fit in 2 CPUs
    with pytest.raises(RuntimeError, match=r"needs 9\.25.*ray\.num_learners x ray\.learner_cpus"):
        check_resources(cfg, with_learner=True)
