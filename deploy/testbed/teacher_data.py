"""SMRC-SD teacher-block SFT turns: expert-labelled turns shown with the teacher
block the running system would build, so the tiny model learns to read it (and when not to).

Where the second trajectory comes from: the embedded experts are deterministic (one trajectory per
task), so the STUDENT side is an honest variation, a *detoured expert*: at each step, with
probability `DETOUR_P` (at most `MAX_DETOURS` times per episode), the env receives a uniformly drawn
admissible action other than the expert's; otherwise the expert's own. The expert is a function of
the current state, so it takes over after every detour; an attempt is kept only if it still wins
(up to `ATTEMPTS` draws). The REFERENCE is the plain expert episode of the same task (another
successful trajectory, different from the student's whenever a detour happened). Every student
turn's target is the expert's action at that state (DAgger-style labels: at a detour state the
label is what the expert would do there, never the detour itself).

Each student turn t is routed onto the reference with the run's matcher (`routing.matching.route`,
`method.matcher`), and its prompt is rendered by SMRC-SD's own router
(`deploy.stages.smrc_sd.TeacherRouter._teacher_prompt`, parts full_reference + state_summary +
candidate_action, `method.teacher_max_chars`), i.e. token-identical to what training scores:

- teacher_matched: the turn matched a reference position; the block carries the candidate action;
- teacher_unmatched: either the turn did not match (a detour state: the block shows the reference
  and the state, no candidate), or the reference is another task's expert episode (signatures
  carry the task id, so nothing matches and no candidate is shown).

- teacher_followed: the pair with roles swapped (the plain expert episode as the student, the
  detoured winner as the reference), only its matched turns whose candidate (the reference's action
  there: a detour) differs from the expert's own, with the CANDIDATE as the target. The expert is
  deterministic, so on every other matched turn the candidate is also predictable from the state
  alone and a model that never reads the block fits them; these turns are the ones it cannot fit
  without reading the candidate (the reference won after that action, so following it is what the
  teacher is for).

`teacher_turns` returns about half with a candidate (`sft.teacher_followed_share` of them followed,
default three quarters, the rest matched: a model that copies the candidate fits both) and half
unmatched (split between the two sources), drawn at random from the pools of the given tasks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from deploy.config import TrainConfig
from deploy.stages.smrc_sd import TeacherRouter
from deploy.testbed.types import SFTTurn
from envs.registry import make_env
from envs.types import TaskSpec
from rollout_workers.episode import Episode
from rollout_workers.parsing import action_choice
from rollout_workers.types import Trajectory, Turn
from routing.matching import route
from routing.types import RouteDecision

DETOUR_P = 0.25
"""Per-step chance the detoured expert sends a random admissible action instead of its own."""
MAX_DETOURS = 2
"""Most detours per student episode (keeps it winnable within the env's step limit)."""
ATTEMPTS = 4
"""Detoured attempts per task before the task is skipped (only winning attempts are references)."""


@dataclass(frozen=True)
class PlayedTurn:
    """One env step of a played episode: what the prompt showed, what was sent, the expert's label."""

    observation: str
    admissible: tuple[str, ...]
    action: str
    expert_action: str
    next_observation: str


def play(env, task: TaskSpec, rng: random.Random | None, *, detour_p: float = DETOUR_P,
         max_detours: int = MAX_DETOURS) -> tuple[list[PlayedTurn], bool]:
    """Play `task` with the (detoured, when `rng` is given) expert; (turns, won)."""
    obs, info = env.reset(options={"task": task})
    turns: list[PlayedTurn] = []
    done = won = False
    detours = 0
    while not done:
        admissible = tuple(info["admissible_commands"])
        expert = env.expert_action()
        action = expert
        if rng is not None and detours < max_detours and rng.random() < detour_p:
            others = [a for a in admissible if a not in (expert, "help")]
            if others:
                action, detours = rng.choice(others), detours + 1
        nxt, _, won, truncated, info = env.step(action)
        turns.append(PlayedTurn(obs, admissible, action, expert, nxt))
        obs, done = nxt, won or truncated
    return turns, bool(won)


def to_trajectory(task: TaskSpec, turns: Sequence[PlayedTurn], *, traj_id: str, group_id: str,
                  won: bool) -> Trajectory:
    """A played episode as a recorded `Trajectory` (no engine ids: routing and re-rendering read only
    the env side: observations, admissible actions, env actions)."""
    rows = tuple(
        Turn(prompt_ids=(), response_ids=(), sampler_logprobs=(), response_text=action_choice(t.action),
             action=t.action, env_action=t.action, action_valid=True, observation=t.observation,
             admissible_actions=t.admissible, next_observation=t.next_observation)
        for t in turns)
    return Trajectory(task=task, group_id=group_id, traj_id=traj_id, turns=rows, success=won,
                      score=1.0 if won else 0.0, policy_version=0, end_reason="won" if won else "step_limit")


@dataclass(frozen=True)
class TaskPair:
    """One task's student (detoured expert) and reference (plain expert) episodes."""

    student: Episode
    labels: tuple[str, ...]
    """The expert's action at each student state (the SFT target)."""
    reference: Episode


def task_pair(env, task: TaskSpec, episode: Sequence | None, rng: random.Random) -> TaskPair | None:
    """The student/reference pair of `task`, or None when no detoured attempt won or no detour
    happened in any winning one (then there is no second, different trajectory). `episode` (the
    task's `deploy.laptop.sft.ExpertTurn`s, optional) is checked against the replayed expert."""
    ref_turns, ref_won = play(env, task, None)
    if not ref_won:
        return None
    if episode is not None and [t.action for t in episode] != [t.action for t in ref_turns]:
        raise ValueError(f"task {task.task_id}: the replayed expert differs from the given expert episode "
                         "(episodes must be expert_episodes(cfg.env, tasks), in the same order)")
    for attempt in range(ATTEMPTS):
        turns, won = play(env, task, rng)
        if won and [t.action for t in turns] != [t.action for t in ref_turns]:
            gid = f"sft-teacher/{task.task_id}"
            student = to_trajectory(task, turns, traj_id=f"{gid}/detour{attempt}", group_id=gid, won=True)
            reference = to_trajectory(task, ref_turns, traj_id=f"{gid}/expert", group_id=gid, won=True)
            return TaskPair(Episode(student), tuple(t.expert_action for t in turns), Episode(reference))
    return None


def make_router(cfg: TrainConfig, tokenizer) -> TeacherRouter:
    """SMRC-SD's router as training builds it (parts full_reference + state_summary + candidate_action)."""
    m = cfg.method
    return TeacherRouter(method="smrc_sd", matcher=m.matcher, parts=None, audit_matchers=(), rollout=cfg.rollout,
                         tokenizer=tokenizer, max_chars=m.teacher_max_chars, seed=cfg.sft.seed)


def pair_turns(router: TeacherRouter, tokenizer, pair: TaskPair, reference: Episode,
               matcher: str) -> list[tuple[int, SFTTurn]]:
    """(turn index, SFTTurn) for every student turn of `pair` under `reference` (the pair's own
    reference, or another task's)."""
    trace = pair.student.trace()
    decisions = route(matcher, trace, reference.trace())  # type: ignore[arg-type]
    out = []
    for t, decision in enumerate(decisions):
        prompt = router._teacher_prompt(pair.student, t, reference, decision, trace)
        target = tokenizer.encode(action_choice(pair.labels[t]), add_special_tokens=False) + [tokenizer.eos_token_id]
        kind = "teacher_matched" if decision.matched else "teacher_unmatched"
        out.append((t, SFTTurn(tuple(prompt), tuple(target), kind)))
    return out


@dataclass(frozen=True)
class FollowedStates:
    """A pair with roles swapped: `student` is the plain expert, `reference` the detoured winner,
    `trace` the student's trace, `states` the (turn, decision) of its matched turns whose candidate
    differs from the expert's own action."""

    student: Episode
    reference: Episode
    trace: object
    states: list[tuple[int, RouteDecision]]


def followed_states(pair: TaskPair, matcher: str) -> FollowedStates:
    """The followed states of `pair` (module docstring)."""
    student, reference = pair.reference, pair.student
    trace = student.trace()
    decisions = route(matcher, trace, reference.trace())  # type: ignore[arg-type]
    states = [(t, d) for t, d in enumerate(decisions)
              if d.matched and d.candidate_action and d.candidate_action != student.traj.turns[t].env_action]
    return FollowedStates(student, reference, trace, states)


def followed_turns(router: TeacherRouter, tokenizer, pair: TaskPair, matcher: str) -> list[SFTTurn]:
    """teacher_followed turns of `pair`: its followed states, target = the candidate."""
    f = followed_states(pair, matcher)
    out = []
    for t, decision in f.states:
        prompt = router._teacher_prompt(f.student, t, f.reference, decision, f.trace)
        target = tokenizer.encode(action_choice(decision.candidate_action), add_special_tokens=False)
        out.append(SFTTurn(tuple(prompt), (*target, tokenizer.eos_token_id), "teacher_followed"))
    return out


def teacher_turns(cfg: TrainConfig, tokenizer, episodes, tasks, rng: random.Random, *, n: int) -> list[SFTTurn]:
    """`n` teacher-block turns from `tasks` (their expert `episodes`, same order): about n/2 with a
    candidate (`sft.teacher_followed_share` of them teacher_followed, the rest teacher_matched), n/4
    unmatched positions of a same-task reference, n/4 turns under another task's reference (a pool
    short of its share is filled from the others)."""
    if n <= 0:
        return []
    if len(episodes) != len(tasks):
        raise ValueError(f"teacher_turns got {len(episodes)} expert episodes for {len(tasks)} tasks: pass "
                         "expert_episodes(cfg.env, tasks) (every expert episode must win)")
    router, matcher = make_router(cfg, tokenizer), cfg.method.matcher
    env = make_env(cfg.env)
    order = list(range(len(tasks)))
    rng.shuffle(order)
    pools: dict[str, list[SFTTurn]] = {"matched": [], "followed": [], "unmatched": [], "other_task": []}
    with_candidate = n - n // 2
    followed = int(cfg.sft.teacher_followed_share * with_candidate)
    want = {"matched": with_candidate - followed, "followed": followed,
            "unmatched": n // 4, "other_task": n // 2 - n // 4}
    previous: TaskPair | None = None
    try:
        for i in order:
            if all(len(pools[k]) >= 2 * want[k] for k in pools):
                break  # pools twice the share: enough to draw from at random
            pair = task_pair(env, tasks[i], episodes[i], rng)
            if pair is None:
                continue
            for _, turn in pair_turns(router, tokenizer, pair, pair.reference, matcher):
                pools["matched" if turn.kind == "teacher_matched" else "unmatched"].append(turn)
            pools["followed"].extend(followed_turns(router, tokenizer, pair, matcher))
            if previous is not None and previous.reference.task_id != pair.student.task_id:
                pools["other_task"].extend(turn for _, turn in pair_turns(router, tokenizer, pair, previous.reference,
                                                                          matcher))
            previous = pair
    finally:
        env.close()
    return draw(pools, want, rng, n)


def draw(pools: dict[str, list[SFTTurn]], want: dict[str, int], rng: random.Random, n: int) -> list[SFTTurn]:
    """Each pool's share drawn without replacement; shortfalls filled from what the pools have left."""
    picked: list[SFTTurn] = []
    left: list[SFTTurn] = []
    for key, pool in pools.items():
        pool = list(pool)
        rng.shuffle(pool)
        picked.extend(pool[: want[key]])
        left.extend(pool[want[key]:])
    rng.shuffle(left)
    picked.extend(left[: max(0, n - len(picked))])
    if len(picked) < n:
        raise ValueError(f"only {len(picked)} teacher turns could be built for the {n} requested: use more "
                         "sft.num_tasks or a lower sft.teacher_fraction")
    return picked
