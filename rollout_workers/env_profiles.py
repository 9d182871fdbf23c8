"""Per-env rollout choices, read from each environment's plugin (`envs.api.EnvPlugin`, resolved by
name through `envs.registry`): the profile the rollout loop and every re-rendering of a recorded
turn use. Nothing here knows an environment by name.

| field               | from the plugin                                                      |
|---------------------|----------------------------------------------------------------------|
| render_message      | `rollout_workers.prompts.render_turn_message` with `plugin.prompt`   |
| instruction         | `plugin.instruction` (the task line the reset observation shows)     |
| format_observation  | `plugin.prompt.format_observation`                                   |
| fallback_chars      | `plugin.fallback_chars`                                              |
| constrained_choices | `plugin.constrained_actions`, each wrapped in action tags            |
| proposer_setting    | `plugin.vocabulary.setting`                                          |
| task_score_metric   | `plugin.task_score_metric`                                           |
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from envs.registry import get_plugin
from envs.types import TaskSpec
from rollout_workers.parsing import ParsedAction, constrained_choices, parse_action
from rollout_workers.prompts import render_turn_message


class MessageRenderer(Protocol):
    """One turn's user message with an env's prompt pieces."""

    def __call__(self, *, task: str, current_observation: str, admissible_actions: Sequence[str],
                 history: Sequence[tuple[str, str]], history_length: int, use_think: bool,
                 skill_text: str | None = None, teacher_context: str | None = None) -> str: ...


@dataclass(frozen=True)
class RolloutEnvProfile:
    """How the rollout side plays and shows one env (its plugin, `envs.api.EnvPlugin`).

    `instruction(reset_observation)`: the task line the observation shows ("" when it shows none);
    `format_observation(observation, task)`: a raw observation as the prompts show it;
    `fallback_chars`: the untagged output's tail the env receives (`parsing.parse_action`);
    `constrained_choices(admissible, task)`: the responses constrained decoding allows;
    `proposer_setting`: the UniSkill proposer prompt's description of the env;
    `task_score_metric`: the rollout metric of the env's raw task score (`Trajectory.task_score`),
    None when the env reports none."""

    env: str
    plugin: Any

    @property
    def render_message(self) -> MessageRenderer:
        return functools.partial(render_turn_message, self.plugin.prompt)

    def instruction(self, reset_observation: str) -> str:
        return self.plugin.instruction(reset_observation)

    def format_observation(self, observation: str, task: str) -> str:
        return self.plugin.prompt.format_observation(observation, task)

    @property
    def fallback_chars(self) -> int:
        return self.plugin.fallback_chars

    def constrained_choices(self, admissible: Sequence[str], instruction: str) -> list[str]:
        return constrained_choices(self.plugin.constrained_actions(admissible, instruction))

    @property
    def proposer_setting(self) -> str:
        return self.plugin.vocabulary.setting

    @property
    def instance_pattern(self) -> str:
        """The env's pattern of instance-specific text (UniSkill's rule critic refuses it in a skill)."""
        return self.plugin.vocabulary.instance_pattern

    @property
    def task_score_metric(self) -> str | None:
        return self.plugin.task_score_metric

    @property
    def reports_task_score(self) -> bool:
        return self.task_score_metric is not None

    def task_text(self, task: TaskSpec, reset_observation: str) -> str:
        """The prompt's task line, read from the reset observation (the TaskSpec's instruction
        when the observation does not show it)."""
        return self.instruction(reset_observation) or task.instruction

    def parse_action(self, output: str, *, require_think: bool) -> ParsedAction:
        return parse_action(output, require_think=require_think, fallback_chars=self.fallback_chars)


@functools.cache
def rollout_profile(env: str) -> RolloutEnvProfile:
    """The env's rollout profile; a ValueError naming the registered envs for an unknown name."""
    return RolloutEnvProfile(env=env, plugin=get_plugin(env))
