"""The lockstep episode loop on the real EnvPool (embedded household env): with a scripted
engine for exact control, and end to end with the HF engine on the tiny model."""

from __future__ import annotations

import pytest

from envs.config import EnvConfig
from envs.faults import FailingEnvFactory
from envs.pool import EnvPool
from envs.tasks import sample_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.hf_engine import HFEngine
from rollout_workers.loop import run_episodes
from rollout_workers.types import Generation

ENV = EnvConfig(max_steps=4)


class ScriptedEngine:
    """Answers every prompt with `respond(call, row)`; ids are the text's tokens + EOS."""

    def __init__(self, tokenizer, respond):
        self.tokenizer, self.respond, self.calls, self.batch_sizes = tokenizer, respond, 0, []

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        self.batch_sizes.append(len(prompts))
        out = []
        for row in range(len(prompts)):
            text = self.respond(self.calls, row)
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (
                self.tokenizer.eos_token_id,
            )
            out.append(
                Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), text=text, finish_reason="stop")
            )
        self.calls += 1
        return out

    def reload_weights(self, path):
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), EngineConfig(engine="hf", device="cpu"))


def cfg(**kw) -> RolloutConfig:
    return RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, **kw)


def run(engine, pools, tasks, group_size=2, rollout=None, **kw):
    return run_episodes(
        engine,
        pools,
        tasks,
        group_size=group_size,
        policy_version=7,
        cfg=rollout or cfg(),
        temperature=1.0,
        seed=3,
        **kw,
    )


def test_end_to_end_hf_engine_groups_and_turns(hf_engine):
    tasks = sample_tasks(ENV, "train", 2, seed=0)
    trajs, stats = run(hf_engine, [EnvPool(ENV, 6)], tasks, group_size=3)
    assert len(trajs) == 6 and len({t.traj_id for t in trajs}) == 6
    for task in tasks:
        group = [t for t in trajs if t.task == task]
        assert len(group) == 3 and len({t.group_id for t in group}) == 1
        assert len({t.turns[0].observation for t in group}) == 1  # shared seed -> same initial state
        assert len({t.turns[0].prompt_ids for t in group}) == 1
    assert len({t.group_id for t in trajs}) == 2
    for t in trajs:
        assert t.policy_version == 7 and t.end_reason in ("won", "step_limit") and len(t.turns) <= 4
        assert t.success == (t.end_reason == "won") and t.score == sum(u.reward for u in t.turns)
        for prev, turn in zip(t.turns, t.turns[1:]):
            assert turn.observation == prev.next_observation
        for turn in t.turns:
            assert turn.action_valid and turn.response_text == f"<action>{turn.action}</action>"
            assert (
                turn.allowed_token_ids is not None
                and turn.response_ids[-1] == hf_engine.tokenizer.eos_token_id
            )
            assert hf_engine.tokenizer.decode(turn.prompt_ids).endswith("<|im_start|>assistant\n")
    assert stats.num_episodes == 6 and stats.num_turns == sum(len(t.turns) for t in trajs)
    assert stats.num_generated_tokens == sum(len(u.response_ids) for t in trajs for u in t.turns)
    assert stats.num_prompt_tokens == sum(len(u.prompt_ids) for t in trajs for u in t.turns)
    assert 0 < stats.generate_s + stats.env_s <= stats.total_s


def test_one_batched_generate_per_turn_and_history_in_prompt(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda call, row: "<action>look</action>")
    trajs, _ = run(engine, [EnvPool(ENV, 4)], sample_tasks(ENV, "train", 2, seed=1))
    assert engine.batch_sizes == [4, 4, 4, 4]  # lockstep: all live episodes in one call per turn
    t = trajs[0]
    assert t.end_reason == "step_limit" and [u.action for u in t.turns] == ["look"] * 4
    second = tokenizer.decode(t.turns[1].prompt_ids)
    assert f"[Observation 1: '{t.turns[0].observation}', Action 1: 'look']" in second
    assert "You are now at step 2 and your current observation is: " + t.turns[0].next_observation in second


def test_invalid_outputs_are_flagged_and_sent_as_last_30_chars(tokenizer):
    text = "i will not use the tags at all, sorry"
    engine = ScriptedEngine(tokenizer, lambda call, row: text)
    trajs, _ = run(engine, [EnvPool(ENV, 2)], sample_tasks(ENV, "train", 1, seed=2))
    turn = trajs[0].turns[0]
    assert turn.action is None and not turn.action_valid and turn.invalid_reason == "missing_action_tags"
    assert turn.next_observation == "Nothing happens."
    assert f"Action 1: '{text[-30:]}'" in tokenizer.decode(trajs[0].turns[1].prompt_ids)


def test_prompt_guard_ends_episode_explicitly(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda call, row: "<action>look</action>")
    tasks = sample_tasks(ENV, "train", 1, seed=3)
    probe, _ = run(engine, [EnvPool(ENV, 2)], tasks)
    first_len = len(probe[0].turns[0].prompt_ids)
    trajs, _ = run(engine, [EnvPool(ENV, 2)], tasks, rollout=cfg(max_prompt_tokens=first_len + 2))
    assert all(t.end_reason == "prompt_too_long" and len(t.turns) == 1 for t in trajs)
    none, _ = run(engine, [EnvPool(ENV, 2)], tasks, rollout=cfg(max_prompt_tokens=first_len - 1))
    assert all(t.end_reason == "prompt_too_long" and not t.turns for t in none)
    assert none[0].end_detail == f"turn 0: prompt of {first_len} tokens > rollout.max_prompt_tokens={first_len - 1}"
    assert all(t.infrastructure_failure for t in trajs + none)


def test_env_error_on_step_and_on_reset(tokenizer):
    engine = ScriptedEngine(
        tokenizer,
        lambda call, row: "<action>boom</action>" if (call, row) == (0, 0) else "<action>look</action>",
    )
    tasks = sample_tasks(ENV, "train", 2, seed=4)
    pool = EnvPool(
        ENV, 4, env_factory=FailingEnvFactory(fail_on_action="boom", fail_on_task_id=tasks[1].task_id)
    )
    trajs, _ = run(engine, [pool], tasks)
    broken_step, survivor, *reset_failed = trajs
    assert broken_step.end_reason == "env_error" and len(broken_step.turns) == 1
    assert broken_step.turns[0].action == "boom" and broken_step.turns[0].next_observation == ""
    assert survivor.end_reason == "step_limit" and len(survivor.turns) == 4
    assert all(t.end_reason == "env_error" and not t.turns and not t.success for t in reset_failed)
    assert broken_step.end_detail.startswith("turn 1: ") and "boom" in broken_step.end_detail
    assert all(t.end_detail.startswith("at reset: ") for t in reset_failed)
    assert survivor.end_detail is None and not survivor.infrastructure_failure


def test_waves_when_pools_are_smaller_than_the_batch(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda call, row: "<action>inventory</action>")
    tasks = sample_tasks(ENV, "train", 3, seed=5)
    trajs, _ = run(engine, [EnvPool(ENV, 3), EnvPool(ENV, 2)], tasks)  # 5 slots: 2 groups per wave
    assert [t.task for t in trajs] == [tasks[0]] * 2 + [tasks[1]] * 2 + [tasks[2]] * 2
    assert all(len(t.turns) == 4 for t in trajs)
    with pytest.raises(ValueError, match="group_size=3"):
        run(engine, [EnvPool(ENV, 2)], tasks, group_size=3)

