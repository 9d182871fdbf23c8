"""Per-env rollout choices, in one table: env name -> the profile the rollout loop and every
re-rendering of a recorded turn use.

| field               | ALFWorld                         | WebShop                                   |
|---------------------|----------------------------------|-------------------------------------------|
| render_message      | `prompts.render_alfworld_message`| `prompts_webshop.render_webshop_message`  |
| instruction         | the "Your task is to:" line      | the page's "Instruction:" part            |
| format_observation  | as is                            | verl-agent's quoted view of the page      |
| fallback_chars      | 30                               | 20 (verl-agent's projections)             |
| constrained_choices | `parsing.alfworld_choices`       | `parsing.webshop_choices`                 |
| proposer_setting    | `proposer.ALFWORLD_SETTING`      | `proposer.WEBSHOP_SETTING`                |
| task_score_metric   | None (no raw score)              | "webshop_task_score"                      |

A new environment adds one entry to `PROFILES` (its renderer, parsing and proposer text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from envs.types import TaskSpec
from rollout_workers.parsing import ParsedAction, alfworld_choices, parse_action, webshop_choices
from rollout_workers.prompts import render_alfworld_message, task_description
from rollout_workers.prompts_webshop import format_observation, render_webshop_message, webshop_instruction
from rollout_workers.proposer import ALFWORLD_SETTING, WEBSHOP_SETTING


class MessageRenderer(Protocol):
    """One turn's user message with an env's verl-agent template."""

    def __call__(self, *, task: str, current_observation: str, admissible_actions: Sequence[str],
                 history: Sequence[tuple[str, str]], history_length: int, use_think: bool,
                 skill_text: str | None = None, teacher_context: str | None = None) -> str: ...


def _as_is(observation: str, task: str) -> str:
    return observation


@dataclass(frozen=True)
class RolloutEnvProfile:
    """How the rollout side plays and shows one env.

    `instruction(reset_observation)`: the task line the observation shows ("" when it shows none);
    `format_observation(observation, task)`: a raw observation as the prompts show it;
    `fallback_chars`: the untagged output's tail the env receives (`parsing.parse_action`);
    `constrained_choices(admissible, task)`: the responses constrained decoding allows;
    `proposer_setting`: the UniSkill proposer prompt's description of the env;
    `task_score_metric`: the rollout metric of the env's raw task score (`Trajectory.task_score`),
    None when the env reports none."""

    env: str
    render_message: MessageRenderer
    instruction: Callable[[str], str]
    format_observation: Callable[[str, str], str]
    fallback_chars: int
    constrained_choices: Callable[[Sequence[str], str], list[str]]
    proposer_setting: str
    task_score_metric: str | None = None

    @property
    def reports_task_score(self) -> bool:
        return self.task_score_metric is not None

    def task_text(self, task: TaskSpec, reset_observation: str) -> str:
        """The prompt's task line, read from the reset observation (the TaskSpec's instruction
        when the observation does not show it)."""
        return self.instruction(reset_observation) or task.instruction

    def parse_action(self, output: str, *, require_think: bool) -> ParsedAction:
        return parse_action(output, require_think=require_think, fallback_chars=self.fallback_chars)


PROFILES: dict[str, RolloutEnvProfile] = {
    "alfworld": RolloutEnvProfile(
        env="alfworld", render_message=render_alfworld_message, instruction=task_description,
        format_observation=_as_is, fallback_chars=30, constrained_choices=alfworld_choices,
        proposer_setting=ALFWORLD_SETTING),
    "webshop": RolloutEnvProfile(
        env="webshop", render_message=render_webshop_message, instruction=webshop_instruction,
        format_observation=format_observation, fallback_chars=20, constrained_choices=webshop_choices,
        proposer_setting=WEBSHOP_SETTING, task_score_metric="webshop_task_score"),
}


def rollout_profile(env: str) -> RolloutEnvProfile:
    """The env's rollout profile; a ValueError naming the known envs for any other name."""
    try:
        return PROFILES[env]
    except KeyError:
        raise ValueError(f"no rollout profile for env {env!r}; known envs: {', '.join(sorted(PROFILES))}") from None
