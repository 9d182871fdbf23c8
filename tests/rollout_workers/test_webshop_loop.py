"""The episode loop on the embedded WebShop (real EnvPool): the shopper's actions through the loop,
and the HF engine on the tiny model with and without constrained decoding."""

from __future__ import annotations

import pytest

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from envs.webshop.prompts import format_observation, webshop_search_queries
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.hf_engine import HFEngine
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.loop import run_episodes
from rollout_workers.prompts import render_skill_block
from rollout_workers.types import Generation

ENV = EnvConfig(name="webshop", webshop_num_products=20)
TEAM = "operating in the WebShop e\u2011commerce environment"


class ShopperEngine:
    """Answers with the embedded env's scripted shopper (one live episode: row 0 is slot 0)."""

    def __init__(self, tokenizer, pool: EnvPool):
        self.tokenizer, self.pool = tokenizer, pool

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        assert len(prompts) == 1
        text = f"<action>{self.pool.expert_actions([0])[0]}</action>"
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.tokenizer.eos_token_id,)
        return [Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), text=text, finish_reason="stop")]

    def reload_weights(self, path):
        pass


@pytest.fixture(scope="module")
def tasks():
    return eval_tasks(ENV, "valid_unseen", 2)


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), EngineConfig(engine="hf", device="cpu"))


def _run(engine, pool, tasks, rollout, group_size=1):
    return run_episodes(
        engine, [pool], tasks, group_size=group_size, policy_version=2, cfg=rollout, temperature=1.0, seed=5
    )


def test_shopper_through_the_loop_wins_with_score_one(hf_engine, tasks):
    pool = EnvPool(ENV, 1)
    rollout = RolloutConfig(
        use_think=False, max_response_tokens=64, history_length=2, max_prompt_tokens=100_000
    )
    (traj,), _ = _run(ShopperEngine(hf_engine.tokenizer, pool), pool, tasks[:1], rollout)
    assert traj.success and traj.end_reason == "won" and traj.task_score == 1.0 and traj.score == 10.0
    assert traj.turns[-1].env_action == "click[buy now]" and all(t.action_valid for t in traj.turns)
    first, second = (hf_engine.tokenizer.decode(t.prompt_ids) for t in traj.turns[:2])
    assert TEAM in first and f"Your task is to: {tasks[0].instruction}.\n" in first
    assert "Your current observation is: 'Search'.\n" in first and "'search[<your query>]',\n" in first
    shown = format_observation(traj.turns[0].observation, tasks[0].instruction)
    assert f"[Observation 1: '{shown}', Action 1: '{traj.turns[0].env_action}']" in second


def test_hf_engine_constrained_to_clicks_and_instruction_searches(hf_engine, tasks):
    rollout = RolloutConfig(
        use_think=False,
        constrained_actions=True,
        max_response_tokens=16,
        history_length=1,
        max_turns=4,
        max_prompt_tokens=100_000,
    )
    trajs, stats = _run(hf_engine, EnvPool(ENV, 4), tasks, rollout, group_size=2)
    assert len(trajs) == 4 and stats.num_turns == sum(len(t.turns) for t in trajs) > 0
    for t in trajs:
        assert t.task_score is not None and 0.0 <= t.task_score <= 1.0 and t.success == (t.task_score == 1.0)
        for turn in t.turns:
            allowed = rollout_profile("webshop").constrained_choices(turn.admissible_actions, t.task.instruction)
            assert turn.response_text in allowed and turn.action_valid and turn.allowed_token_ids is not None
            if turn.action.startswith("search["):
                assert turn.action[len("search[") : -1] in webshop_search_queries(t.task.instruction)
            else:
                assert turn.action in turn.admissible_actions


def test_hf_engine_unconstrained_uses_the_20_char_fallback(hf_engine, tasks):
    rollout = RolloutConfig(
        use_think=False,
        constrained_actions=False,
        max_response_tokens=12,
        history_length=0,
        max_turns=2,
        max_prompt_tokens=100_000,
    )
    trajs, _ = _run(hf_engine, EnvPool(ENV, 1), tasks[:1], rollout)
    untagged = [turn for turn in trajs[0].turns if turn.action is None]
    assert untagged, "the untrained tiny model does not write action tags"
    for turn in untagged:
        assert turn.env_action == turn.response_text.lower()[-20:] and not turn.action_valid
    assert all(TEAM in hf_engine.tokenizer.decode(turn.prompt_ids) for turn in trajs[0].turns)


def test_skill_texts_fill_the_skill_slot_of_their_task(hf_engine, tasks):
    rollout = RolloutConfig(
        use_think=False,
        constrained_actions=True,
        max_response_tokens=16,
        history_length=1,
        max_turns=2,
        max_prompt_tokens=100_000,
    )
    skill = "Search with the product words only, then pick every option the task names."
    trajs, _ = run_episodes(
        hf_engine,
        [EnvPool(ENV, 2)],
        tasks,
        group_size=1,
        policy_version=2,
        cfg=rollout,
        temperature=1.0,
        seed=5,
        skill_texts={tasks[0].task_id: skill, tasks[1].task_id: None},
    )
    with_skill, without = ([hf_engine.tokenizer.decode(u.prompt_ids) for u in t.turns] for t in trajs)
    block = render_skill_block(skill)
    assert all(block + "Your admissible actions" in p for p in with_skill)
    assert not any("<skill>" in p for p in without)
