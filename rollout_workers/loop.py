"""The lockstep multi-turn episode loop.

For each task, G episodes start from the same state (the G resets share the task's seed). Every
turn renders one prompt per live episode, makes ONE batched `engine.generate` call for all of
them, parses the responses, and steps the environments in one batch per EnvPool. An episode
ends when the env says done ("won"; "step_limit" when truncated at its horizon; "ended" otherwise, e.g. a WebShop purchase below the success score), when its env crashed ("env_error"), when its
next prompt would exceed `max_prompt_tokens` ("prompt_too_long": explicit, never truncated), or
at `max_turns` ("step_limit").

If the pools hold fewer slots than tasks x G, tasks run in waves of whole groups.

Per env (`task.env`, `rollout_workers.env_profiles`): the prompt renderer and task line (WebShop:
the instruction shown on the reset page), the projection's fallback length and the
constrained-decoding choices. An env that reports a raw `score` in its step info (WebShop) has
the last one stored as `Trajectory.task_score`.

UniSkill: `skill_texts` (task_id -> retrieved skill text, or None) fills the actor prompt's skill
slot of every episode of that task (`prompts.render_skill_block`); without it (or with None for a
task) prompts are verl-agent's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from envs.types import EndReason, EnvStep, TaskSpec
from rollout_workers.config import RolloutConfig
from rollout_workers.engines.base import Engine, derive_seed
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import ParsedAction
from rollout_workers.prompts import render_prompt_ids
from rollout_workers.turn_messages import render_message, task_text
from rollout_workers.types import Generation, RolloutStats, Trajectory, Turn


class EnvPoolClient(Protocol):
    """What the loop needs from an EnvPool: the local `envs.pool.EnvPool` or deploy's Ray
    adapter. `step` answers a crash with `env_error` set and done=True (the env is recreated)."""

    def num_envs(self) -> int: ...

    def reset(self, slots: list[int], tasks: list[TaskSpec]) -> list[EnvStep]: ...

    def step(self, slots: list[int], actions: list[str]) -> list[EnvStep]: ...


@dataclass
class _LiveEpisode:
    """An episode in play (mutated turn by turn); `_trajectory` freezes it when it ends."""

    task: TaskSpec
    group_id: str
    traj_id: str
    pool: EnvPoolClient
    slot: int
    task_text: str = ""
    skill_text: str | None = None
    observation: str = ""
    admissible: tuple[str, ...] = ()
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation shown, action sent)
    turns: list[Turn] = field(default_factory=list)
    score: float = 0.0
    task_score: float | None = None
    won: bool = False
    end_reason: EndReason = "running"
    end_detail: str | None = None

    @property
    def live(self) -> bool:
        return self.end_reason == "running"


@dataclass
class _Counters:
    generate_s: float = 0.0
    env_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


def run_episodes(
    engine: Engine,
    pools: Sequence[EnvPoolClient],
    tasks: Sequence[TaskSpec],
    *,
    group_size: int,
    policy_version: int,
    cfg: RolloutConfig,
    temperature: float,
    seed: int,
    skill_texts: Mapping[str, str | None] | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Play `group_size` episodes of every task; trajectories come back grouped by task.
    `skill_texts` maps task_id -> the skill shown in that task's prompts (None/absent: no skill)."""
    start = time.perf_counter()
    slots = [(pool, s) for pool in pools for s in range(pool.num_envs())]
    per_wave = len(slots) // group_size
    if tasks and per_wave == 0:
        raise ValueError(f"the EnvPools hold {len(slots)} envs; one group needs group_size={group_size}")
    counters, trajectories = _Counters(), []
    for w, first in enumerate(range(0, len(tasks), max(per_wave, 1))):
        episodes = _start_wave(tasks[first : first + per_wave], group_size, slots, counters)
        for e in episodes:
            e.skill_text = (skill_texts or {}).get(e.task.task_id)
        for turn in range(cfg.max_turns):
            live = [e for e in episodes if e.live]
            if not live:
                break
            _play_turn(engine, live, cfg, temperature, derive_seed(seed, w, turn), counters)
        for e in episodes:
            if e.live:  # max_turns reached before the env's own step limit
                e.end_reason = "step_limit"
        trajectories += [_trajectory(e, policy_version) for e in episodes]
    stats = RolloutStats(
        num_episodes=len(trajectories),
        num_turns=sum(len(t.turns) for t in trajectories),
        num_generated_tokens=counters.generated_tokens,
        num_prompt_tokens=counters.prompt_tokens,
        generate_s=counters.generate_s,
        env_s=counters.env_s,
        total_s=time.perf_counter() - start,
    )
    return trajectories, stats


def _start_wave(tasks: Sequence[TaskSpec], group_size: int, slots, counters: _Counters) -> list[_LiveEpisode]:
    episodes = new_episodes(tasks, group_size, slots)
    t0 = time.perf_counter()
    steps = _env_call("reset", episodes, [e.task for e in episodes])
    counters.env_s += time.perf_counter() - t0
    for e, step in zip(episodes, steps):
        apply_reset(e, step)
    return episodes


def new_episodes(tasks: Sequence[TaskSpec], group_size: int, slots) -> list[_LiveEpisode]:
    """`group_size` episodes per task (one group id per task), on `slots[0], slots[1], ...`."""
    episodes = []
    for task in tasks:
        group_id = f"{task.task_id}@{task.seed}#{uuid.uuid4().hex[:10]}"
        for k in range(group_size):
            pool, slot = slots[len(episodes)]
            episodes.append(_LiveEpisode(task, group_id, f"{group_id}/{k}", pool, slot))
    return episodes


def apply_reset(e: _LiveEpisode, step: EnvStep) -> None:
    """Record the env's reset step in the episode (an env error at reset ends it)."""
    e.observation, e.admissible = step.observation, tuple(step.admissible_actions)
    e.task_text = task_text(e.task, step.observation)
    if "score" in step.info:
        e.task_score = float(step.info["score"])
    if step.env_error is not None:
        e.end_reason, e.end_detail = "env_error", f"at reset: {step.env_error}"


def _play_turn(
    engine: Engine,
    live: list[_LiveEpisode],
    cfg: RolloutConfig,
    temperature: float,
    seed: int,
    counters: _Counters,
) -> None:
    prompts = [turn_prompt(engine, e, cfg) for e in live]
    acting = [(e, p) for e, p in zip(live, prompts) if p is not None]
    if not acting:
        return
    episodes, prompt_ids = [e for e, _ in acting], [p for _, p in acting]
    choices = [turn_choices(e) for e in episodes]
    t0 = time.perf_counter()
    gens = engine.generate(
        prompt_ids,
        temperature=temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_response_tokens,
        seed=seed,
        choices=choices if cfg.constrained_actions else None,
    )
    counters.generate_s += time.perf_counter() - t0
    counters.prompt_tokens += sum(len(p) for p in prompt_ids)
    counters.generated_tokens += sum(len(g.token_ids) for g in gens)
    parsed = [parse_response(e, g, cfg) for e, g in zip(episodes, gens)]
    t0 = time.perf_counter()
    steps = _env_call("step", episodes, [p.env_action for p in parsed])
    counters.env_s += time.perf_counter() - t0
    for e, p, g, pa, step in zip(episodes, prompt_ids, gens, parsed, steps):
        record_step(e, p, g, pa, step)


# Per-episode pieces of a turn, shared with the per-episode async loop (agent_loop.py).


def turn_prompt(engine: Engine, e: _LiveEpisode, cfg: RolloutConfig) -> list[int] | None:
    """The episode's next prompt ids; None after ending it with "prompt_too_long" when longer than
    `rollout.max_prompt_tokens`."""
    p = _prompt_ids(engine, e, cfg)
    if len(p) > cfg.max_prompt_tokens:
        e.end_reason = "prompt_too_long"
        e.end_detail = (f"turn {len(e.turns)}: prompt of {len(p)} tokens > rollout.max_prompt_tokens="
                        f"{cfg.max_prompt_tokens}")
        return None
    return p


def turn_choices(e: _LiveEpisode) -> list[str]:
    """The responses constrained decoding allows this turn (used when rollout.constrained_actions)."""
    return rollout_profile(e.task.env).constrained_choices(e.admissible, e.task_text)


def parse_response(e: _LiveEpisode, g: Generation, cfg: RolloutConfig) -> ParsedAction:
    return rollout_profile(e.task.env).parse_action(g.text, require_think=cfg.use_think)


def record_step(e: _LiveEpisode, prompt: list[int], g: Generation, pa: ParsedAction, step: EnvStep) -> None:
    """Append the turn to the episode and advance it with the env's step."""
    e.turns.append(_turn(e, prompt, g, pa, step))
    _advance(e, pa, step)


def _prompt_ids(engine: Engine, e: _LiveEpisode, cfg: RolloutConfig) -> list[int]:
    message = render_message(e.task.env, task=e.task_text, current_observation=e.observation,
                             admissible_actions=e.admissible, history=e.history, rollout=cfg,
                             skill_text=e.skill_text)
    return render_prompt_ids(engine.tokenizer, message)  # type: ignore[arg-type]


def _turn(e: _LiveEpisode, prompt: list[int], g: Generation, pa: ParsedAction, step: EnvStep) -> Turn:
    return Turn(
        prompt_ids=tuple(prompt),
        response_ids=g.token_ids,
        sampler_logprobs=g.logprobs,
        allowed_token_ids=g.allowed_token_ids,
        response_text=g.text,
        action=pa.action,
        env_action=pa.env_action,
        action_valid=pa.valid,
        invalid_reason=pa.reason,
        observation=e.observation,
        admissible_actions=e.admissible,
        next_observation=step.observation,
        reward=step.reward,
    )


def _advance(e: _LiveEpisode, pa: ParsedAction, step: EnvStep) -> None:
    e.history.append((e.observation, pa.env_action))
    e.observation, e.admissible = step.observation, tuple(step.admissible_actions)
    e.score += step.reward
    if "score" in step.info:
        e.task_score = float(step.info["score"])
    e.won = e.won or step.won
    if step.env_error is not None:
        e.end_reason, e.end_detail = "env_error", f"turn {len(e.turns)}: {step.env_error}"
    elif step.done:
        e.end_reason = "won" if step.won else "ended" if not step.truncated else "step_limit"


def _trajectory(e: _LiveEpisode, policy_version: int) -> Trajectory:
    return Trajectory(
        task=e.task,
        group_id=e.group_id,
        traj_id=e.traj_id,
        turns=tuple(e.turns),
        success=e.won and e.end_reason == "won",
        score=e.score,
        task_score=e.task_score,
        skill_text=e.skill_text,
        policy_version=policy_version,
        end_reason=e.end_reason,
        end_detail=e.end_detail,
    )


def _env_call(method: str, episodes: list[_LiveEpisode], payload: list) -> list[EnvStep]:
    """One batched call per pool (pools in parallel); results in `episodes` order."""
    by_pool: dict[int, list[int]] = {}
    for i, e in enumerate(episodes):
        by_pool.setdefault(id(e.pool), []).append(i)

    def call(idx: list[int]) -> list[EnvStep]:
        pool = episodes[idx[0]].pool
        return getattr(pool, method)([episodes[i].slot for i in idx], [payload[i] for i in idx])

    groups = list(by_pool.values())
    if len(groups) == 1:
        results = [call(groups[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(groups)) as ex:
            results = list(ex.map(call, groups))
    out: list[EnvStep | None] = [None] * len(episodes)
    for idx, steps in zip(groups, results):
        if len(steps) != len(idx):
            raise RuntimeError(f"EnvPool.{method} returned {len(steps)} steps for {len(idx)} slots")
        for i, step in zip(idx, steps):
            out[i] = step
    return out  # type: ignore[return-value]
