"""RolloutWorker in-process (HF engine, tiny model, real EnvPool): collect, weight sync by files and
by broadcast over a gloo weight-sync group (the sender in a spawned process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import sample_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.worker import RolloutWorker

ENV = EnvConfig(max_steps=2)


def test_collect_and_weight_sync_through_files(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    rollout = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, seed=1)
    worker = RolloutWorker(
        EngineConfig(engine="hf", device="cpu"), rollout, str(tiny_model_dir), [EnvPool(ENV, 4)]
    )
    tasks = sample_tasks(ENV, "train", 2, seed=0)
    trajs, stats = worker.collect(tasks, group_size=2, policy_version=0)
    assert len(trajs) == 4 and stats.num_episodes == 4 and worker.policy_version() == 0
    assert all(t.policy_version == 0 for t in trajs)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(tmp_path / "export")
    files = {p.name: p.read_bytes() for p in Path(tmp_path / "export").iterdir()}
    worker.load_weight_files(files, version=1)
    assert worker.policy_version() == 1
    engine = worker.engine
    prompt = list(trajs[0].turns[0].prompt_ids)
    after = engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=4, seed=0)[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + list(after.token_ids)])).logits[
            0, len(prompt) - 1 : -1
        ]
    ref = logits.log_softmax(-1).gather(-1, torch.tensor(after.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=1e-4)
    trajs2, _ = worker.collect(tasks, group_size=2, policy_version=1, temperature=0.4)
    assert all(t.policy_version == 1 for t in trajs2)


def _scaled(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    return model


def _broadcast_scaled(spec, model_dir) -> None:
    from weightsync.group import WeightGroup
    from weightsync.protocol import send_weights
    from weightsync.stream import parameter_stream

    metas, stream = parameter_stream(_scaled(model_dir))
    send_weights(WeightGroup(spec, 0), metas, stream, bucket_bytes=1 << 15)


def test_weight_sync_by_broadcast(tiny_model_dir, tmp_path):
    import multiprocessing as mp

    from weightsync.group import GroupSpec

    worker = RolloutWorker(EngineConfig(engine="hf", device="cpu"), RolloutConfig(use_think=False, seed=1),
                           str(tiny_model_dir), [EnvPool(ENV, 1)])
    prompt = list(range(3, 40))
    before = worker.engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=4, seed=0)[0]
    assert worker.weight_group_ranks() == 1
    spec = GroupSpec(name="test", members=("learner_0", "rollout_worker_0"), timeout_s=60,
                     store_file=str(tmp_path / "store"))
    sender = mp.get_context("spawn").Process(target=_broadcast_scaled, args=(spec, str(tiny_model_dir)))
    sender.start()
    worker.join_weight_group(spec, 1)
    assert worker.receive_weights(version=3) == len(list(_scaled(tiny_model_dir).parameters()))
    sender.join(timeout=60)
    assert sender.exitcode == 0 and worker.policy_version() == 3 and worker.weights_digest() is None
    after = worker.engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=4, seed=0)[0]
    with torch.no_grad():
        logits = _scaled(tiny_model_dir)(input_ids=torch.tensor([prompt + list(after.token_ids)])).logits
    ref = logits[0, len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(after.token_ids)[:, None])
    assert torch.allclose(torch.tensor(after.logprobs), ref.squeeze(-1), atol=1e-4)
    assert before.logprobs != after.logprobs


def test_config_guards(tiny_model_dir):
    with pytest.raises(ValueError, match="max_model_len=1000"):
        RolloutWorker(
            EngineConfig(engine="hf", max_model_len=1000),
            RolloutConfig(),
            str(tiny_model_dir),
            [EnvPool(ENV, 1)],
        )
    with pytest.raises(ValueError, match="use_think=false"):
        RolloutConfig(constrained_actions=True)
    with pytest.raises(ValueError, match="extra"):
        RolloutConfig(group_sizes=3)
