"""Skills written from the environments' ground truth, for the skill and proposer SFT turns and the
skill-gain measurement: each environment's own (`EnvPlugin.ground_truth()`, e.g.
`envs.alfworld.ground_truth`, `envs.webshop.ground_truth`), reached through its plugin.

Every skill is general advice (object classes and steps, never object numbers) and passes the
bank's text rules (`skillbank_service.validation.validate_skill_text`). A task gets a helpful skill
(about its own task type and object classes / product options), an irrelevant one (about another
task type / product category, naming none of the task's own words) and a vague one (the task's
kind without places or options: the retrieved skill a proposer should UPDATE).
"""

from __future__ import annotations

import random

from envs.config import EnvConfig
from envs.registry import plugin_for
from envs.types import TaskSpec


def _truth(env: EnvConfig):
    truth = plugin_for(env).ground_truth()
    if truth is None:
        raise ValueError(f"env {env.name!r} gives no ground-truth skills (its plugin's ground_truth() is None), "
                         "which the testbed's skill turns need; build the testbed on an env that has them")
    return truth


def helpful_skill(env: EnvConfig, task: TaskSpec) -> str:
    """The task's ground-truth skill (deterministic)."""
    return _truth(env).helpful(env, task)


def irrelevant_skill(env: EnvConfig, task: TaskSpec, rng: random.Random) -> str:
    """A ground-truth skill about another task type / product category (drawn with `rng`)."""
    return _truth(env).irrelevant(env, task, rng)


def vague_skill(env: EnvConfig, task: TaskSpec) -> str:
    """An incomplete skill for the task's kind (no places, appliance or options): the retrieved skill a
    proposer should UPDATE with the full ground-truth text."""
    return _truth(env).vague(env, task)
