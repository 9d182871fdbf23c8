"""Rollout placement with a tensor-parallel engine: the config check that ties ray.rollout_gpus to
engine.tensor_parallel_size, the bundle layout, and (on a real local Ray cluster that declares two
logical GPUs; this machine has none) a worker placed in its bundle 0 whose vLLM picks the Ray
executor over that placement group. Whether vLLM then runs tensor-parallel needs real GPUs.
Also: learner ranks that fit on one node keep the one-node FileStore rendezvous."""

from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.reaper import RENDEZVOUS_PREFIX
from deploy.topology import place_learners, remove_rollout_placements, rollout_bundles, rollout_worker_options

TP2 = ["engine.tensor_parallel_size=2", "ray.rollout_gpus=2", "ray.rollout_cpus=1"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["engine.tensor_parallel_size=2", "ray.rollout_gpus=1"], (r"ray\.rollout_gpus=1 must be a multiple of engine\."
     r"tensor_parallel_size=2.*set ray\.rollout_gpus=2")),
    (["engine.tensor_parallel_size=2", "ray.rollout_gpus=3"], r"must be a multiple"),
    (["engine.tensor_parallel_size=2", "ray.rollout_gpus=4"], (r"2 x engine\.tensor_parallel_size=2.*idle.*"
     r"rollout\.num_workers")),
    (["ray.rollout_gpus=1.5"], r"ray\.rollout_gpus=1\.5 must be a multiple of engine\.tensor_parallel_size=1"),
    (["engine.tensor_parallel_size=2"], r"needs GPUs.*ray\.rollout_gpus=0.*set ray\.rollout_gpus=2"),
    (["engine.tensor_parallel_size=2", "ray.rollout_gpus=2", "engine.engine=hf"], r"engine\.engine='vllm' only"),
])
def test_rollout_gpus_must_match_tensor_parallel(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_bundle_layout_one_whole_gpu_per_tensor_parallel_rank():
    assert rollout_bundles(load_config(None, ["ray.rollout_gpus=1"])) is None  # no placement group
    # a shared GPU is allowed (with the object-store sync: NCCL refuses two ranks on one GPU)
    assert rollout_bundles(load_config(None, ["ray.rollout_gpus=0.5", "sync.method=object_store"])) is None
    cfg = load_config(None, ["engine.tensor_parallel_size=4", "ray.rollout_gpus=4", "ray.rollout_cpus=3"])
    assert rollout_bundles(cfg) == [{"CPU": 3.0, "GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]


class _Probe:
    """Stands in for a RolloutWorker: reports the placement it got and vLLM's executor choice."""

    def report(self) -> dict:
        import ray
        from ray.util import get_current_placement_group
        from vllm.config import ParallelConfig

        group = get_current_placement_group()
        return {"bundles": group.bundle_specs if group else None, "own_gpus": ray.get_gpu_ids(),
                "executor": ParallelConfig(tensor_parallel_size=2).distributed_executor_backend}


def _wait_for(ok, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.ray
def test_tensor_parallel_worker_sits_in_its_placement_group(monkeypatch):
    import ray
    from ray.util.placement_group import placement_group_table

    cfg = load_config(None, TP2)
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, namespace="test_topology")  # logical GPUs
    try:
        options = rollout_worker_options(cfg, 0)
        assert options["num_gpus"] == 0 and options["num_cpus"] == 1.0
        group = options["scheduling_strategy"].placement_group
        table = placement_group_table(group)
        assert table["strategy"] == "STRICT_PACK" and table["state"] == "CREATED"
        assert ray.available_resources().get("GPU", 0.0) == 0.0  # both GPUs reserved for the engine
        probe = ray.remote(_Probe).options(**options).remote()
        report = ray.get(probe.report.remote(), timeout=300)
        assert report["bundles"] == [{"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0}]
        assert report["own_gpus"] == []  # the GPUs are left to vLLM's per-rank workers
        assert report["executor"] == "ray"
        with monkeypatch.context() as short:  # only the refusal waits briefly, not the learners' rendezvous below
            short.setattr("deploy.topology.PLACEMENT_TIMEOUT_S", 2)
            with pytest.raises(RuntimeError, match=r"rollout worker 1: engine\.tensor_parallel_size=2 GPUs"):
                rollout_worker_options(cfg, 1)  # no GPU left for a second engine
        ray.kill(probe)
        assert remove_rollout_placements() == 2  # both groups (the pending one too) are released
        _wait_for(lambda: ray.available_resources().get("GPU", 0.0) == 2.0)

        # learners that fit on the one node stay there, with the loopback FileStore rendezvous
        place = place_learners(load_config(None, ["ray.num_learners=2", "ray.learner_cpus=0.5"]))
        assert len(place.rank_nodes) == 2 and len(set(place.rank_nodes)) == 1
        assert place.master_addr == "127.0.0.1" and Path(place.rendezvous).name.startswith(RENDEZVOUS_PREFIX)
    finally:
        ray.shutdown()


def test_learner_threads_default_to_the_reserved_cpus_and_can_be_raised():
    from deploy.topology import _actor_env

    def threads(cpus: float, **kw) -> tuple[str, str]:
        env = _actor_env(cpus, log_name="learner_rank0", **kw)["env_vars"]
        return env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]

    assert threads(1.0) == ("1", "1") and threads(0.25) == ("1", "1") and threads(4.0) == ("4", "4")
    assert threads(1.0, threads=2) == ("2", "2")
    assert load_config(None, ["ray.learner_threads=2"]).ray.learner_threads == 2
    with pytest.raises(ValueError, match="learner_threads"):
        load_config(None, ["ray.learner_threads=0"])
