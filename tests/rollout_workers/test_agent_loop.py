"""The per-episode async agent loop (`rollout.loop: async`, rollout_workers/agent_loop.py) returns
the same trajectories as the lockstep loop for the same tasks and seeds: on the HF engine behind
its dynamic batcher (waves included) and, through `RolloutWorker`, on vLLM's AsyncLLM (which also
loads new weights from files and by broadcast)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import sample_tasks
from rollout_workers.agent_loop import run_episodes_async
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.async_batch import BatchingAsyncEngine
from rollout_workers.engines.hf_engine import HFEngine
from rollout_workers.loop import run_episodes
from rollout_workers.worker import RolloutWorker
from weightsync.group import GroupSpec

ENV = EnvConfig(max_steps=3)


def assert_same_trajectories(lockstep, agent, atol=1e-5):
    """Every recorded field equal (group ids are random per call: compared by position); sampler
    logprobs to `atol`, since the two loops batch the requests differently."""
    assert len(lockstep) == len(agent)
    for a, b in zip(lockstep, agent):
        assert a.task == b.task and a.traj_id.rsplit("/", 1)[1] == b.traj_id.rsplit("/", 1)[1]
        assert (a.success, a.score, a.task_score, a.skill_text, a.policy_version, a.end_reason, a.end_detail) == (
            b.success, b.score, b.task_score, b.skill_text, b.policy_version, b.end_reason, b.end_detail)
        assert len(a.turns) == len(b.turns)
        for u, v in zip(a.turns, b.turns):
            assert u.model_copy(update={"sampler_logprobs": ()}) == v.model_copy(update={"sampler_logprobs": ()})
            assert torch.allclose(torch.tensor(u.sampler_logprobs), torch.tensor(v.sampler_logprobs), atol=atol)


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), EngineConfig(engine="hf", device="cpu"))


@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "free_form"])
def test_async_loop_matches_lockstep_on_hf(hf_engine, constrained):
    # 3 tasks x G=2 on 4 slots: two waves in lockstep; the async loop reuses freed slots instead.
    cfg = RolloutConfig(use_think=False, constrained_actions=constrained, max_response_tokens=24, seed=1)
    tasks = sample_tasks(ENV, "train", 3, seed=0)
    kw = {"group_size": 2, "policy_version": 4, "cfg": cfg, "temperature": 1.0, "seed": 5,
              "skill_texts": {tasks[0].task_id: "Look before you act."}}
    lock, lock_stats = run_episodes(hf_engine, [EnvPool(ENV, 4)], tasks, **kw)
    batcher = BatchingAsyncEngine(hf_engine)
    agent, stats = asyncio.run(run_episodes_async(batcher, [EnvPool(ENV, 4)], tasks, **kw))
    # Sampled at temperature 1; seeds agree with lockstep's because no episode ends early here.
    assert {len(t.turns) for t in lock} == {3}
    assert_same_trajectories(lock, agent)
    assert agent[0].skill_text == "Look before you act." and agent[-1].skill_text is None
    assert len({t.group_id for t in agent}) == 3 and len({t.traj_id for t in agent}) == 6
    assert (stats.num_turns, stats.num_generated_tokens, stats.num_prompt_tokens) == (
        lock_stats.num_turns, lock_stats.num_generated_tokens, lock_stats.num_prompt_tokens)
    assert 0 < stats.generate_s <= stats.total_s and 0 < stats.env_s <= stats.total_s
    assert sum(batcher.batch_sizes) == stats.num_turns  # one request per episode turn
    batcher.close()


CPU_VLLM = EngineConfig(engine="vllm", dtype="float32", kv_cache_memory_bytes=64 << 20, max_model_len=2048)


def test_worker_async_loop_on_vllm_async_engine(tiny_model_dir, tmp_path, hf_model, reference_logprobs):
    """Lockstep on the in-process vLLM engine and the async loop on AsyncLLM give the same
    trajectories; the async engine then loads new weights through the worker's file path and by
    broadcast."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    rollout = RolloutConfig(use_think=False, constrained_actions=False, max_response_tokens=24, seed=2,
                            max_prompt_tokens=1536)
    tasks = sample_tasks(ENV, "train", 2, seed=1)
    lock_worker = RolloutWorker(CPU_VLLM, rollout, str(tiny_model_dir), [EnvPool(ENV, 4)])
    lock, _ = lock_worker.collect(tasks, group_size=2, policy_version=0)
    del lock_worker
    worker = RolloutWorker(CPU_VLLM, rollout.model_copy(update={"loop": "async"}), str(tiny_model_dir),
                           [EnvPool(ENV, 4)])
    try:
        agent, stats = worker.collect(tasks, group_size=2, policy_version=0)
        assert {len(t.turns) for t in lock} == {3}
        assert_same_trajectories(lock, agent, atol=1e-4)
        assert stats.num_generated_tokens == sum(len(u.response_ids) for t in agent for u in t.turns)

        model = hf_model.__class__.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)
        model.save_pretrained(tmp_path / "export")
        files = {p.name: p.read_bytes() for p in Path(tmp_path / "export").iterdir()}
        worker.load_weight_files(files, version=1)
        prompt = list(agent[0].turns[0].prompt_ids)
        [after] = worker.engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=6, seed=0)
        ref = reference_logprobs(model, prompt, after.token_ids, 1.0)
        assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(ref), atol=1e-4)
        again, _ = worker.collect(tasks, group_size=2, policy_version=1)
        assert {t.policy_version for t in again} == {1}

        # Broadcast weight sync into AsyncLLM's engine-core process (the spec crosses its RPC).
        spec = GroupSpec(name="agent-loop", members=("learner_0", "rollout_worker_0"), timeout_s=60,
                         store_file=str(tmp_path / "store"))
        sender = mp.get_context("spawn").Process(target=_broadcast_halved, args=(spec, str(tiny_model_dir)))
        sender.start()
        worker.join_weight_group(spec, 1)
        assert worker.receive_weights(version=2) == len(list(model.parameters()))
        sender.join(timeout=60)
        assert sender.exitcode == 0
        [after] = worker.engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=6, seed=0)
        ref = reference_logprobs(_halved(tiny_model_dir), prompt, after.token_ids, 1.0)
        assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(ref), atol=1e-4)
        worker.leave_weight_group()
    finally:
        worker.shutdown()


def _halved(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model


def _broadcast_halved(spec, model_dir) -> None:
    from weightsync.group import WeightGroup
    from weightsync.protocol import send_weights
    from weightsync.stream import parameter_stream

    metas, stream = parameter_stream(_halved(model_dir))
    send_weights(WeightGroup(spec, 0), metas, stream, bucket_bytes=1 << 15)
