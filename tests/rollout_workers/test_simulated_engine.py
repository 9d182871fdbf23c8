"""`engine.engine: simulated`: the latency model's arithmetic, seeded responses that parse as the
admissible action they were constrained to, and continuous batching's busy time."""

from __future__ import annotations

import asyncio

import pytest

from rollout_workers.config import EngineConfig
from rollout_workers.engines.latency import MODELS, LatencyModel
from rollout_workers.engines.registry import make_async_engine, make_engine
from rollout_workers.engines.simulated import SimTokenizer, SimulatedAsyncEngine, SimulatedEngine
from rollout_workers.parsing import parse_action

GPU = LatencyModel("test", prefill_tps=1000.0, single_stream_tps=100.0, peak_decode_tps=1000.0)


def test_latency_model():
    assert GPU.step_s(1) == pytest.approx(0.01) and GPU.step_s(10) == pytest.approx(0.01)
    assert GPU.step_s(40) == pytest.approx(0.04)  # past the knee the GPU's peak divides among the requests
    # prefill 300 tokens, then 2 steps with 2 requests, 3 more with the longer one alone
    assert GPU.batch_s([100, 200], [2, 5]) == pytest.approx(0.3 + 5 * 0.01)
    for model in MODELS.values():  # bigger model, slower everything
        assert model.prefill_tps > 0 and model.single_stream_tps < model.peak_decode_tps
    assert MODELS["7b-h100"].step_s(64) > MODELS["1.7b-h100"].step_s(64)


def test_tokenizer_round_trips_words():
    tok = SimTokenizer()
    text = "<action>go to desk 1</action>"
    assert tok.decode(tok.encode(text)) == text
    assert tok(text)["input_ids"] == tok.encode(text)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).endswith("<|assistant|>")


def test_sync_engine_is_seeded_and_answers_with_a_choice():
    cfg = EngineConfig(engine="simulated", simulated_time_scale=1e-6, simulated_response_tokens=30)
    engine = make_engine(cfg, "unused")
    assert isinstance(engine, SimulatedEngine)
    choices = [["<action>look</action>", "<action>go to desk 1</action>"]] * 3
    a = engine.generate([[1, 2, 3]] * 3, temperature=1.0, top_p=1.0, max_tokens=64, seed=7, choices=choices)
    b = engine.generate([[1, 2, 3]] * 3, temperature=1.0, top_p=1.0, max_tokens=64, seed=7, choices=choices)
    assert a == b and len({g.token_ids for g in a}) > 1
    for g in a:
        assert g.token_ids[-1] == 2 and len(g.logprobs) == len(g.token_ids) <= 64
        parsed = parse_action(g.text, require_think=True, fallback_chars=30)
        assert parsed.valid and parsed.action in {"look", "go to desk 1"}
    assert engine.busy_s > 0


def test_async_engine_batches_continuously():
    cfg = EngineConfig(engine="simulated", simulated_time_scale=0.01, simulated_response_tokens=200)
    engine = make_async_engine(cfg, "unused")
    assert isinstance(engine, SimulatedAsyncEngine)

    async def run(seeds) -> list:
        return await asyncio.gather(*(engine.generate_one([1] * 100, temperature=1.0, top_p=1.0, max_tokens=400,
                                                          seed=s) for s in seeds))

    gens = asyncio.run(run(range(16)))
    together = engine.busy_s
    alone = 0.0
    for s in range(16):
        before = engine.busy_s
        asyncio.run(run([s]))
        alone += engine.busy_s - before
    longest = max(len(g.token_ids) for g in gens)
    # served together: about the longest request's decode steps (+ 16 prefills), far below one by one
    assert together == pytest.approx(MODELS["1.7b-h100"].step_s(16) * longest, rel=0.5)
    assert together < alone / 4
