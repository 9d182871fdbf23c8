"""An environment's prompt pieces: the text around a turn and how an observation and the actions read.

The actor's per-turn user message is rendered by one renderer for every environment
(`rollout_workers.prompts.render_turn_message`) from an environment's `PromptPieces`:

- `first_template` (the first turn, or any turn when history is off) and `history_template`
  (later turns) are `str.format` templates with the fields `task_description`,
  `current_observation`, `admissible_actions` and, in the history template, `step_count`,
  `history_length`, `action_history`, `current_step`. Each holds the current-observation line
  (`NO_HIS_OBS_LINE` / `HIS_OBS_LINE`) and the actions line (`ACTIONS_LINE`): SMRC-SD's teacher
  block goes right before the former and UniSkill's skill block right before the latter.
- `format_observation(observation, task)`: a raw observation as the prompt shows it (current and
  history turns alike); `format_actions(actions)`: the admissible actions' list body.
- `think_instructions` closes both templates; `use_think=False` swaps it for
  `action_only_instructions`.
- `max_history_chars`: when the history message would be longer, the first-turn template is used
  instead (verl-agent's WebShop rule); None = never.

`standard_prompt(system)` builds the pieces of an environment from one sentence describing it;
the built-in environments spell verl-agent's templates out character for character instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NO_HIS_OBS_LINE = "Your current observation is: "
HIS_OBS_LINE = "You are now at step {current_step} and your current observation is: "
ACTIONS_LINE = "Your admissible actions of the current situation are: "

THINK_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags.\n"
)
ACTION_ONLY_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should choose an admissible action for current step and present it within "
    "<action> </action> tags.\n"
)
FREE_FORM_ACTIONS = "any command the environment understands"
"""What `quoted_actions` shows when an environment lists no admissible actions (free-form)."""


def as_is(observation: str, task: str) -> str:
    """The observation unchanged (the default `format_observation`)."""
    return observation


def quoted_actions(actions: Sequence[str]) -> str:
    """verl-agent's list body: quoted actions joined by newline + space (`FREE_FORM_ACTIONS` for
    an empty list)."""
    return "\n ".join(f"'{a}'" for a in actions) or FREE_FORM_ACTIONS


@dataclass(frozen=True)
class PromptPieces:
    """How one environment's turns read in the actor's prompt (see the module docstring)."""

    first_template: str
    """The first turn's message (fields: task_description, current_observation, admissible_actions)."""
    history_template: str
    """A later turn's message (adds step_count, history_length, action_history, current_step)."""
    think_instructions: str = THINK_INSTRUCTIONS
    """The closing instructions, which both templates end with."""
    action_only_instructions: str = ACTION_ONLY_INSTRUCTIONS
    """What replaces `think_instructions` when the policy is not asked to reason (use_think=False)."""
    format_observation: Callable[[str, str], str] = as_is
    """(raw observation, task line) -> the observation as the prompt shows it."""
    format_actions: Callable[[Sequence[str]], str] = quoted_actions
    """The admissible actions -> the text of the `admissible_actions` field."""
    max_history_chars: int | None = None
    """Use the first-turn template when the history message would exceed this many characters."""

    def __post_init__(self) -> None:
        for name, template, obs_line in (("first_template", self.first_template, NO_HIS_OBS_LINE),
                                         ("history_template", self.history_template, HIS_OBS_LINE)):
            if template.count(obs_line) != 1 or template.count(ACTIONS_LINE) != 1:
                raise ValueError(f"PromptPieces.{name} must hold the line {obs_line!r} once and, after it, "
                                 f"{ACTIONS_LINE!r} once (standard_prompt builds templates that do)")
            if self.think_instructions not in template:
                raise ValueError(f"PromptPieces.{name} must end with its think_instructions")


def standard_prompt(system: str, *, format_observation: Callable[[str, str], str] = as_is,
                    format_actions: Callable[[Sequence[str]], str] = quoted_actions) -> PromptPieces:
    """The pieces of an environment described by one sentence (`system`, e.g. "You are an expert
    agent playing a text adventure."): verl-agent's ALFWorld layout with the task line in both
    templates."""
    head = "\n" + system.replace("{", "{{").replace("}", "}}") + "\nYour task is to: {task_description}\n"
    actions = ACTIONS_LINE + "[{admissible_actions}].\n\n" + THINK_INSTRUCTIONS
    first = head + NO_HIS_OBS_LINE + "{current_observation}\n" + actions
    history = (head + "Prior to this step, you have already taken {step_count} step(s). Below are the most "
               "recent {history_length} observations and the corresponding actions you took: {action_history}\n"
               + HIS_OBS_LINE + "{current_observation}\n" + actions)
    return PromptPieces(first_template=first, history_template=history, format_observation=format_observation,
                        format_actions=format_actions)
