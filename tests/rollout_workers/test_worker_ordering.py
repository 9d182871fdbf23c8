"""The worker's ordering guarantee on a real Ray actor: a weight update submitted while a collect
runs starts only after that collect returned, every trajectory of the collect carries the old
version, and a collect submitted after the update runs on the new weights. The actor is threaded
(max_concurrency=2), so Ray alone would run the update at once: the worker's own guard orders it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import sample_tasks
from rollout_workers.config import EngineConfig, RolloutConfig

ENV = EnvConfig(max_steps=3)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    # address="local": a fresh cluster even when another one runs on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test_worker_ordering")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def new_weight_files(tiny_model_dir, tmp_path_factory) -> dict[str, bytes]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    out = tmp_path_factory.mktemp("export")
    model.save_pretrained(out)
    return {p.name: p.read_bytes() for p in Path(out).iterdir()}


@pytest.mark.parametrize("loop", ["async", "lockstep"])
def test_weight_update_waits_for_running_collect(ray_local, tiny_model_dir, new_weight_files, loop):
    from rollout_workers.worker import RolloutWorker

    ray = ray_local
    rollout = RolloutConfig(use_think=False, max_response_tokens=48, seed=3, loop=loop)
    worker = ray.remote(RolloutWorker).options(max_concurrency=2, num_cpus=1).remote(
        EngineConfig(engine="hf", device="cpu"), rollout, str(tiny_model_dir), [EnvPool(ENV, 8)])
    ray.get(worker.policy_version.remote())  # constructed
    tasks = sample_tasks(ENV, "train", 8, seed=0)
    first = worker.collect.remote(tasks, group_size=2, policy_version=0)  # 16 episodes, 2 waves: ~2 s
    time.sleep(0.5)  # the collect is running when the update arrives
    update = worker.load_weight_files.remote(new_weight_files, version=1)
    time.sleep(0.3)  # Ray does not order calls on a threaded actor: let the update arrive first
    second = worker.collect.remote(tasks[:1], group_size=2, policy_version=1)
    (trajs1, _), digest, (trajs2, _) = ray.get([first, update, second])
    timeline = ray.get(worker.call_timeline.remote())
    ray.kill(worker)

    assert digest and {t.policy_version for t in trajs1} == {0} and {t.policy_version for t in trajs2} == {1}
    [c1, up, c2] = timeline  # in order of completion
    assert (c1["call"], up["call"], c2["call"]) == ("collect", "load_weight_files", "collect")
    # Test setup: the update arrived while the first collect ran, the second collect after it.
    assert c1["arrive"] < up["arrive"] < c1["end"] and up["arrive"] < c2["arrive"]
    assert up["start"] >= c1["end"] and c2["start"] >= up["end"]
    assert (c1["version"], up["version"], c2["version"]) == (0, 1, 1)
