"""The actor's per-turn user message for any environment, in one place: the rollout loop renders
live turns with it, and the learner-side re-renderings (SMRC-SD's teacher prompts, UniSkill's
swapped-skill prompts) rebuild recorded turns with it, so all of them share the renderer, task
line and history the loop used (each env's from `rollout_workers.env_profiles`)."""

from __future__ import annotations

from collections.abc import Sequence

from envs.types import TaskSpec
from rollout_workers.config import RolloutConfig
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.types import AnyTrajectory


def task_text(task: TaskSpec, reset_observation: str) -> str:
    """The prompt's task line, read from the reset observation (the TaskSpec's instruction when
    the observation does not show it)."""
    return rollout_profile(task.env).task_text(task, reset_observation)


def render_message(
    env: str,
    *,
    task: str,
    current_observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[tuple[str, str]],
    rollout: RolloutConfig,
    skill_text: str | None = None,
    teacher_context: str | None = None,
) -> str:
    """One turn's user message with `env`'s verl-agent template."""
    render = rollout_profile(env).render_message
    return render(task=task, current_observation=current_observation, admissible_actions=admissible_actions,
                  history=history, history_length=rollout.history_length, use_think=rollout.use_think,
                  skill_text=skill_text, teacher_context=teacher_context)


def recorded_turn_message(
    traj: AnyTrajectory,
    t: int,
    rollout: RolloutConfig,
    *,
    skill_text: str | None,
    teacher_context: str | None = None,
) -> str:
    """Turn t of a recorded trajectory re-rendered; with the trajectory's own skill and no teacher
    block this reproduces the prompt the loop rendered."""
    turns = traj.turns
    return render_message(
        traj.task.env, task=task_text(traj.task, turns[0].observation), current_observation=turns[t].observation,
        admissible_actions=turns[t].admissible_actions, history=[(x.observation, x.env_action) for x in turns[:t]],
        rollout=rollout, skill_text=skill_text, teacher_context=teacher_context)
