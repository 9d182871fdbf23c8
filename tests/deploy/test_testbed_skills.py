"""The testbed's skill and proposer turns (deploy/testbed/skill_data.py, ground_truth.py) and their ability
measurements (deploy/testbed/skill_abilities.py) on the embedded household (both presets) and the
embedded WebShop, with a tiny untrained model (HF engine, real envs, no Ray)."""

from __future__ import annotations

import random

import pytest

from deploy.config import TrainConfig
from deploy.laptop.sft import expert_episodes
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.testbed.ground_truth import helpful_skill, irrelevant_skill
from deploy.testbed.skill_abilities import (
    held_out_proposer_prompts,
    measure_skill_gain,
    proposal_valid,
    proposer_validity,
    skill_gain,
    validity_figure,
)
from deploy.testbed.skill_data import (
    contrasting_pair,
    proposer_example,
    proposer_turns,
    skill_message,
    skill_turns,
)
from envs.alfworld.ground_truth import household_goal, likely_places, mentions
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.registry import make_env
from envs.tasks import eval_tasks, sample_tasks
from envs.webshop.ground_truth import webshop_goal
from rollout_workers.loop import run_episodes
from rollout_workers.prompts import SKILL_INTRO
from rollout_workers.proposer import PREFILL, parse_proposal
from rollout_workers.types import Generation
from skillbank_service.validation import validate_skill_text

ENVS = {
    "easy": EnvConfig(preset="easy", max_steps=30),
    "standard": EnvConfig(preset="standard", max_steps=40),
    "webshop": EnvConfig(name="webshop", webshop_num_products=20, max_steps=10),
}


def _cfg(env: str, **proposer) -> TrainConfig:
    return TrainConfig.model_validate({
        "env": ENVS[env].model_dump(exclude_unset=True),
        "engine": {"engine": "hf", "device": "cpu", "dtype": "float32", "max_model_len": 2048},
        "rollout": {"use_think": False, "history_length": 2 if env != "webshop" else 0, "max_prompt_tokens": 1900,
                    "max_response_tokens": 16, "max_turns": 2},
        "eval": {"k": 1, "temperature": 1.0},
        "uniskill": {"proposer": {"trajectory_max_chars": 600, "max_prompt_tokens": 1900, "max_tokens": 16,
                                  **proposer}},
    })


def _tasks(env: str, n: int):
    cfg = ENVS[env]
    return eval_tasks(cfg, "valid_unseen", n) if env == "webshop" else sample_tasks(cfg, "train", n, seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = []
    for env in ENVS:
        cfg = _cfg(env)
        tasks = _tasks(env, 2)
        for task, ep in zip(tasks, expert_episodes(cfg.env, tasks), strict=True):
            corpus += [skill_message(cfg, task, ep, t, helpful_skill(cfg.env, task)) for t in range(len(ep))]
    tiny = TinyModelConfig(vocab_size=600, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=128, max_position_embeddings=2048, seed=0)
    return build_tiny_model(tmp_path_factory.mktemp("testbed") / "model", corpus, tiny)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _bank_ok(cfg: TrainConfig, text: str) -> bool:
    bank = cfg.uniskill.bank
    return validate_skill_text(text, min_chars=bank.min_chars, max_chars=bank.max_chars) is None


def _task_words(cfg: TrainConfig, task) -> list[str]:
    """The words a skill about this task must name (household) / its product query (WebShop)."""
    if task.env == "webshop":
        return [" ".join(str(webshop_goal(cfg.env, task)["query"]).split()).lower()]
    task_type, obj, recep, toggle = household_goal(task)
    appliance = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}
    verb = next((v for v in appliance if f"_{v}_" in task_type), None)
    return [w for w in (obj, recep, toggle, appliance.get(verb or "")) if w]


@pytest.mark.parametrize("env", list(ENVS))
def test_ground_truth_skills_pass_the_bank_rules_and_helpful_differs_from_irrelevant(env):
    cfg = _cfg(env)
    rng = random.Random(0)
    tasks = _tasks(env, 12)
    assert len({t.task_type for t in tasks}) >= 2
    for task in tasks:
        helpful, irrelevant = helpful_skill(cfg.env, task), irrelevant_skill(cfg.env, task, rng)
        assert _bank_ok(cfg, helpful) and _bank_ok(cfg, irrelevant), (helpful, irrelevant)
        words = _task_words(cfg, task)
        assert all(mentions(helpful, w) for w in words), (task.instruction, helpful)
        assert not any(mentions(irrelevant, w) for w in words), (task.instruction, irrelevant)
        if env != "webshop":  # the most likely place of the goal object (the generator's prior) is named
            assert mentions(helpful, likely_places(household_goal(task)[1])[0])


@pytest.mark.parametrize("env", list(ENVS))
def test_skill_turns_are_the_loops_prompts_with_that_skill(env, tokenizer):
    cfg = _cfg(env)
    tasks = _tasks(env, 2)
    episodes = expert_episodes(cfg.env, tasks)
    turns = skill_turns(cfg, tokenizer, episodes, tasks, random.Random(1), n=8)
    assert [t.kind for t in turns] == ["skill_helpful", "skill_irrelevant"] * 4
    # the loop's own prompts with each task's helpful skill, playing the expert's actions
    rollout = cfg.rollout.model_copy(update={"max_turns": 50})
    loop_prompts = set()
    for task in tasks:
        pool = EnvPool(cfg.env, 1)
        trajs, _ = run_episodes(_ExpertEngine(tokenizer, pool), [pool], [task], group_size=1, policy_version=0,
                                cfg=rollout, temperature=1.0, seed=0,
                                skill_texts={task.task_id: helpful_skill(cfg.env, task)})
        assert trajs[0].success
        loop_prompts |= {t.prompt_ids for t in trajs[0].turns}
    helpfuls = [helpful_skill(cfg.env, t) for t in tasks]
    eos = tokenizer.eos_token_id
    for turn in turns:
        text = tokenizer.decode(turn.prompt_ids)
        assert SKILL_INTRO in text and turn.target_ids[-1] == eos
        assert tokenizer.decode(turn.target_ids[:-1]).startswith("<action>")
        if turn.kind == "skill_helpful":
            assert turn.prompt_ids in loop_prompts
        else:  # the same prompt with the skill text swapped for an irrelevant one
            assert turn.prompt_ids not in loop_prompts
            shown = text.split("<skill>\n", 1)[1].split("\n</skill>", 1)[0]
            assert shown not in helpfuls and _bank_ok(cfg, shown)
            swapped = [tuple(tokenizer.encode(text.replace(shown, h), add_special_tokens=False)) for h in helpfuls]
            assert any(s in loop_prompts for s in swapped)


class _ExpertEngine:
    """Answers the one live episode (slot 0 of `pool`) with the env's expert action."""

    def __init__(self, tokenizer, pool):
        self.tokenizer, self.pool = tokenizer, pool

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        assert len(prompts) == 1
        text = f"<action>{self.pool.expert_actions([0])[0]}</action>"
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return [Generation(token_ids=ids, logprobs=(0.0,) * len(ids), text=text, finish_reason="stop")]


@pytest.mark.parametrize("env", list(ENVS))
def test_proposer_turns_contrast_a_real_failure_and_their_targets_parse(env, tokenizer):
    cfg = _cfg(env)
    tasks = _tasks(env, 3)
    episodes = expert_episodes(cfg.env, tasks)
    turns = proposer_turns(cfg, tokenizer, episodes, tasks, random.Random(2), n=12)
    assert len(turns) == 12 and {t.kind for t in turns} == {"proposer"}
    ops = []
    for turn in turns:
        prompt = tokenizer.decode(turn.prompt_ids)
        target = tokenizer.decode(turn.target_ids[:-1])
        assert prompt.endswith(PREFILL) and turn.target_ids[-1] == tokenizer.eos_token_id
        assert "Outcome: SUCCESS" in prompt and "Outcome: FAILURE" in prompt
        offered = (True, True, "- UPDATE_SKILL:" in prompt)
        parsed = parse_proposal(target, legal=offered, max_skill_chars=cfg.uniskill.bank.max_chars)
        assert parsed.ok, (target, parsed)
        if parsed.op != "no_edit":
            assert _bank_ok(cfg, parsed.skill_text)
        else:  # NO_SKILL only where the retrieved skill already says it
            assert "No skill was retrieved" not in prompt
        # the validity measurement counts exactly the targets that write a skill
        assert proposal_valid(target, offered, cfg) == (parsed.op != "no_edit")
        ops.append(parsed.op)
    assert "add" in ops
    assert not proposal_valid("ADD_NEW_SKILL</action>\n<skill>open</skill>", (True, True, False), cfg)
    # the failure is real: played in the env, it ends without a win
    env_ = make_env(cfg.env)
    success, failure = contrasting_pair(env_, tasks[0], random.Random(5))
    assert success.won and not failure.won and failure.turns


@pytest.mark.parametrize("env", ["easy", "webshop"])
def test_measurements_return_sane_figures_on_an_untrained_model(env, model_dir):
    cfg = _cfg(env, constrain_op=True)
    tasks = _tasks(env, 2)
    gain = skill_gain(cfg, str(model_dir), tasks, seed=0)
    assert gain.n == 2 and len(gain.per_item) == 2 and set(gain.per_item) <= {-1.0, 0.0, 1.0}
    assert -1.0 <= gain.lo <= gain.mean <= gain.hi <= 1.0
    assert gain.mean == pytest.approx(sum(gain.per_item) / 2)
    valid = proposer_validity(cfg, str(model_dir), tasks, seed=0)
    assert 1 <= valid.n <= 2 and set(valid.per_item) <= {0.0, 1.0}
    assert 0.0 <= valid.lo <= valid.mean <= valid.hi <= 1.0


class _SkillReader(_ExpertEngine):
    """Plays the expert only when the prompt shows the task's helpful skill, else an action that
    changes nothing: a policy whose success depends on the skill slot alone."""

    def __init__(self, tokenizer, pool, helpful: set[str]):
        super().__init__(tokenizer, pool)
        self.helpful = helpful

    def generate(self, prompts, **kw):
        text = self.tokenizer.decode(prompts[0])
        if any(f"<skill>\n{h}\n</skill>" in text for h in self.helpful):
            return super().generate(prompts, **kw)
        ids = tuple(self.tokenizer.encode("<action>look</action>", add_special_tokens=False))
        return [Generation(token_ids=ids, logprobs=(0.0,) * len(ids), text="<action>look</action>",
                           finish_reason="stop")]


@pytest.mark.parametrize("env", ["easy", "webshop"])
def test_skill_gain_is_paired_per_task_and_sees_a_skill_reading_policy(env, tokenizer):
    cfg = _cfg(env).model_copy(update={"rollout": _cfg(env).rollout.model_copy(update={"max_turns": 50})})
    tasks = _tasks(env, 3)
    pool = EnvPool(cfg.env, 1)
    engine = _SkillReader(tokenizer, pool, {helpful_skill(cfg.env, t) for t in tasks})
    gain = measure_skill_gain(engine, [pool], cfg, tasks, seed=0)
    assert gain.per_item == (1.0, 1.0, 1.0) and (gain.mean, gain.lo, gain.hi, gain.n) == (1.0, 1.0, 1.0, 3)
    blind = measure_skill_gain(_SkillReader(tokenizer, pool, set()), [pool], cfg, tasks, seed=0)
    assert blind.per_item == (0.0, 0.0, 0.0)


def test_proposer_validity_counts_skills_the_bank_would_take(tokenizer):
    cfg = _cfg("easy")
    tasks = _tasks("easy", 3)
    prompts, legals = held_out_proposer_prompts(cfg, tokenizer, tasks, seed=0)
    assert len(prompts) == 3 and all(legal == (True, True, False) for legal in legals)
    assert all(tokenizer.decode(p).endswith(PREFILL) for p in prompts)
    env_ = make_env(cfg.env)
    right = []
    for task in tasks:
        pair = contrasting_pair(env_, task, random.Random(0))
        right.append(proposer_example(cfg, task, pair, random.Random(0), scenario="none", source_is_success=True)[2])
    assert validity_figure(right, legals, cfg, seed=0).mean == 1.0
    wrong = ["NO_SKILL</action>", "ADD_NEW_SKILL</action>\nuser: do it", right[0].replace("</action>", "")]
    figure = validity_figure(wrong, legals, cfg, seed=0)
    assert figure.per_item == (0.0, 0.0, 0.0) and figure.n == 3
    half = validity_figure([right[0], wrong[0]], legals[:2], cfg, seed=0)
    assert half.mean == 0.5 and half.lo == 0.0 and half.hi == 1.0
