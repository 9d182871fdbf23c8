"""Skill turns and proposer turns of the context-literate cold start.

Skill turns (kinds "skill_helpful" / "skill_irrelevant"): an expert turn rendered exactly as the
rollout loop renders a turn whose task has a retrieved skill (`rollout_workers.turn_messages.
render_message` with `skill_text`, the env's own template and history window), the skill being the
task's ground-truth skill or an irrelevant one (`deploy.testbed.ground_truth`), alternating; the
target is the expert's action reply "<action>a</action>" + EOS either way, so the model learns to
use a skill that applies and to ignore one that does not.

Proposer turns (kind "proposer"): UniSkill's proposer prompt (`rollout_workers.proposer`, rendered
as `deploy.stages.uniskill_glue.proposer_prompts` does, ending in the prefilled "<action>") for a
contrasting pair of one task, both played in the env: the expert's success and a real failure (the
expert for a random number of steps, then random admissible actions other than the expert's until
the env ends the episode, kept only when the env says it was not won). Either one is the source
(Attempt A). The retrieved-skill slot and the target op:

| retrieved skill (share)        | legal ops                  | target                               |
|--------------------------------|----------------------------|--------------------------------------|
| none (1/2)                     | NO_SKILL, ADD_NEW_SKILL    | ADD_NEW_SKILL + the helpful skill    |
| an irrelevant skill (1/6)      | all three                  | ADD_NEW_SKILL + the helpful skill    |
| the helpful skill itself (1/6) | all three                  | NO_SKILL (nothing is missing)        |
| a vague version of it (1/6)    | all three                  | UPDATE_SKILL + the helpful skill     |

The helpful skill states what the success did and the failure did not (where the goal object
tends to be, the appliance, the steps; in WebShop which options to click before buying). The
target is "<OP></action>" (+ "\n" + skill) + EOS, tokenised on its own as the proposer generates it
after the prompt; every target parses with `rollout_workers.proposer.parse_proposal` and its skill
passes the bank's text rules (checked here; a failure is a bug and raises). Prompts longer than
`uniskill.proposer.max_prompt_tokens` are skipped, as UniSkill drops them, and so are examples whose
prompt + target would not fit `engine.max_model_len` (the model's context on the laptop).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from deploy.config import TrainConfig
from deploy.testbed.ground_truth import helpful_skill, irrelevant_skill, vague_skill
from deploy.testbed.types import SFTTurn
from envs.registry import make_env
from envs.types import TaskSpec
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import action_choice
from rollout_workers.prompts import render_prompt_ids
from rollout_workers.proposer import (
    ACTION_CLOSE,
    OP_TOKENS,
    legal_ops,
    parse_proposal,
    render_proposer_message,
    render_proposer_prompt_ids,
    render_trajectory,
)
from rollout_workers.turn_messages import render_message, task_text
from skillbank_service.validation import validate_skill_text


class ExpertStep(Protocol):
    """What a turn of an expert episode carries (`deploy.laptop.sft.ExpertTurn` has it)."""

    @property
    def observation(self) -> str: ...
    @property
    def admissible(self) -> tuple[str, ...]: ...
    @property
    def action(self) -> str: ...


def _check_inputs(cfg: TrainConfig, episodes: Sequence[Sequence[ExpertStep]], tasks: Sequence[TaskSpec], n: int) -> None:
    if n < 0:
        raise ValueError(f"n={n}: the number of turns to build must be >= 0")
    if len(episodes) != len(tasks):
        raise ValueError(f"{len(episodes)} expert episodes for {len(tasks)} tasks: pass the episodes "
                         "`expert_episodes(cfg.env, tasks)` returned for exactly these tasks (all won)")
    if n and not any(episodes):
        raise ValueError("no expert turns to build skill or proposer turns from (every episode is empty)")
    if cfg.rollout.use_think:
        raise ValueError("SFT targets carry no reasoning text: set rollout.use_think=false")


def _target(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False)) + (int(tokenizer.eos_token_id),)


# ---- skill turns ------------------------------------------------------------------------------------


def skill_message(cfg: TrainConfig, task: TaskSpec, episode: Sequence[ExpertStep], t: int, skill: str | None) -> str:
    """Turn t of an expert episode as the loop renders it with `skill` in the actor's skill slot."""
    return render_message(task.env, task=task_text(task, episode[0].observation),
                          current_observation=episode[t].observation, admissible_actions=episode[t].admissible,
                          history=[(x.observation, x.action) for x in episode[:t]], rollout=cfg.rollout,
                          skill_text=skill)


def skill_turns(cfg: TrainConfig, tokenizer, episodes, tasks, rng: random.Random, *, n: int) -> list[SFTTurn]:
    """`n` expert turns (drawn uniformly, without replacement while they last) with a skill block:
    alternately the task's helpful skill ("skill_helpful") and an irrelevant one
    ("skill_irrelevant"); target = the expert's action reply + EOS. A prompt over
    `rollout.max_prompt_tokens` (the loop would end that episode instead) is replaced by another draw."""
    _check_inputs(cfg, episodes, tasks, n)
    if n == 0:
        return []
    positions = [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep))]
    rng.shuffle(positions)
    helpful: dict[int, str] = {}
    out: list[SFTTurn] = []
    for k in range(8 * n + len(positions)):
        if len(out) == n:
            return out
        i, t = positions[k] if k < len(positions) else rng.choice(positions)
        task, episode = tasks[i], episodes[i]
        if len(out) % 2 == 0:
            if i not in helpful:
                helpful[i] = helpful_skill(cfg.env, task)
            skill, kind = helpful[i], "skill_helpful"
        else:
            skill, kind = irrelevant_skill(cfg.env, task, rng), "skill_irrelevant"
        prompt = render_prompt_ids(tokenizer, skill_message(cfg, task, episode, t, skill))
        if len(prompt) > cfg.rollout.max_prompt_tokens:
            continue
        out.append(SFTTurn(tuple(prompt), _target(tokenizer, action_choice(episode[t].action)), kind))
    if len(out) < n:
        raise RuntimeError(f"built {len(out)} of {n} skill turns: most prompts with a skill exceed "
                           f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}; raise it or lower history_length")
    return out


# ---- contrasting pairs, played in the env -------------------------------------------------------------


@dataclass(frozen=True)
class PlayedTurn:
    """One step of a played episode, with what `rollout_workers.proposer.render_trajectory` shows."""

    observation: str
    env_action: str
    next_observation: str
    action_valid: bool = True


@dataclass(frozen=True)
class Played:
    turns: tuple[PlayedTurn, ...]
    won: bool
    reset_observation: str


Policy = Callable[[object, int, tuple[str, ...]], str]
"""(env, step index, admissible actions) -> the action to send."""


def play(env, task: TaskSpec, policy: Policy) -> Played:
    """One episode of `task` in `env` under `policy`, until the env ends it (won from info["won"])."""
    obs, info = env.reset(options={"task": task})
    first, turns, done, won = obs, [], False, False
    while not done:
        admissible = tuple(a for a in info["admissible_commands"] if a != "help")
        action = policy(env, len(turns), admissible)
        nxt, _, terminated, truncated, info = env.step(action)
        turns.append(PlayedTurn(obs, action, nxt))
        won, done, obs = bool(info.get("won", False)), bool(terminated or truncated), nxt
    return Played(tuple(turns), won, first)


def expert_policy(env, step: int, admissible: tuple[str, ...]) -> str:
    return env.expert_action()


def deviating_policy(rng: random.Random, start: int) -> Policy:
    """The expert for `start` steps, then a random admissible action other than the expert's."""

    def act(env, step: int, admissible: tuple[str, ...]) -> str:
        expert = env.expert_action()
        if step < start:
            return expert
        others = [a for a in admissible if a != expert]
        return rng.choice(others) if others else expert

    return act


def contrasting_pair(env, task: TaskSpec, rng: random.Random, *, tries: int = 4) -> tuple[Played, Played] | None:
    """(the expert's success, a real failure) of `task`, or None when the expert does not win or no
    deviation within `tries` failed."""
    success = play(env, task, expert_policy)
    if not success.won or not success.turns:
        return None
    for _ in range(tries):
        failure = play(env, task, deviating_policy(rng, rng.randrange(len(success.turns))))
        if not failure.won:
            return success, failure
    return None


# ---- proposer turns -----------------------------------------------------------------------------------

_SCENARIOS = ("none", "none", "none", "irrelevant", "helpful", "vague")


def proposer_example(cfg: TrainConfig, task: TaskSpec, pair: tuple[Played, Played], rng: random.Random, *,
                     scenario: str, source_is_success: bool) -> tuple[str, tuple[bool, bool, bool], str]:
    """(proposer user message, legal ops, target text after the prefilled "<action>") for one pair."""
    success, failure = pair
    helpful = helpful_skill(cfg.env, task)
    retrieved = {"none": None, "helpful": helpful, "irrelevant": irrelevant_skill(cfg.env, task, rng),
                 "vague": vague_skill(cfg.env, task)}[scenario]
    legal = legal_ops(retrieved is not None)
    op = {"none": "ADD_NEW_SKILL", "irrelevant": "ADD_NEW_SKILL", "helpful": "NO_SKILL",
          "vague": "UPDATE_SKILL"}[scenario]
    source, reference = (success, failure) if source_is_success else (failure, success)
    budget = cfg.uniskill.proposer.trajectory_max_chars
    profile = rollout_profile(task.env)
    message = render_proposer_message(
        setting=profile.proposer_setting, task=profile.task_text(task, source.reset_observation),
        source=render_trajectory(source.turns, won=source.won, max_chars=budget), source_won=source.won,
        reference=render_trajectory(reference.turns, won=reference.won, max_chars=budget),
        skill_text=retrieved, legal=legal)
    target = f"{op}{ACTION_CLOSE}" + ("" if op == "NO_SKILL" else f"\n{helpful}")
    _check_target(cfg, task, target, legal, op)
    return message, legal, target


def _check_target(cfg: TrainConfig, task: TaskSpec, target: str, legal: tuple[bool, bool, bool], op: str) -> None:
    bank = cfg.uniskill.bank
    parsed = parse_proposal(target, legal=legal, max_skill_chars=bank.max_chars)
    if not parsed.ok or OP_TOKENS[("no_edit", "add", "update").index(parsed.op or "no_edit")] != op:
        raise RuntimeError(f"task {task.task_id!r}: proposer target {target!r} does not parse as {op} ({parsed})")
    if parsed.op != "no_edit":
        bad = validate_skill_text(parsed.skill_text, min_chars=bank.min_chars, max_chars=bank.max_chars)
        if bad is not None:
            raise RuntimeError(f"task {task.task_id!r}: ground-truth skill fails the bank's text rules: {bad}")


def proposer_turns(cfg: TrainConfig, tokenizer, episodes, tasks, rng: random.Random, *, n: int) -> list[SFTTurn]:
    """`n` proposer turns over the tasks (cycled in a shuffled order), each a contrasting pair played
    in the env (one pair per task, cached) under a drawn retrieved-skill scenario and source side."""
    _check_inputs(cfg, episodes, tasks, n)
    if n == 0:
        return []
    env = make_env(cfg.env)
    order = [i for i, ep in enumerate(episodes) if ep]
    rng.shuffle(order)
    pairs: dict[int, tuple[Played, Played] | None] = {}
    limit, context = cfg.uniskill.proposer.max_prompt_tokens, cfg.engine.max_model_len
    out: list[SFTTurn] = []
    attempts = 0
    while len(out) < n:
        if attempts >= 4 * n + 4 * len(order):
            raise RuntimeError(f"built {len(out)} of {n} proposer turns: the tasks give too few contrasting pairs "
                               f"or prompts within uniskill.proposer.max_prompt_tokens={limit} (and, with the target, "
                               f"engine.max_model_len={context}); lower uniskill.proposer.trajectory_max_chars")
        i = order[attempts % len(order)]
        attempts += 1
        if i not in pairs:
            pairs[i] = contrasting_pair(env, tasks[i], rng)
        pair = pairs[i]
        if pair is None:
            continue
        message, _, target = proposer_example(cfg, tasks[i], pair, rng, scenario=rng.choice(_SCENARIOS),
                                              source_is_success=rng.random() < 0.5)
        prompt, ids = render_proposer_prompt_ids(tokenizer, message), _target(tokenizer, target)
        if len(prompt) > limit or (context is not None and len(prompt) + len(ids) > context):
            continue
        out.append(SFTTurn(tuple(prompt), ids, "proposer"))
    return out
