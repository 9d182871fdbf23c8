"""verl-agent's ALFWorld prompt pieces, the task line and the constrained actions.

The template text is verl-agent's, character for character (leading and trailing newline, the
space after "tags." and the upstream typo "observaitons" included), because the published
numbers were obtained with it. History lines follow verl-agent's memory (the shared renderer,
`rollout_workers.prompts.render_turn_message`). Admissible actions are listed without `help`.

Departure: `use_think=False` swaps the two closing instructions for one asking only for the
action tag (the tiny laptop model, which cannot reason). Everything else is identical.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.prompt_pieces import THINK_INSTRUCTIONS, PromptPieces

TASK_PREFIX = "Your task is to: "

ALFWORLD_TEMPLATE_NO_HIS = (
    "\n"
    "You are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n"
    "\n" + THINK_INSTRUCTIONS
)
ALFWORLD_TEMPLATE = (
    "\n"
    "You are an expert agent operating in the ALFRED Embodied Environment. "
    "Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observaitons and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n"
    "\n" + THINK_INSTRUCTIONS
)

SKILL_SETTING = "a household task in the ALFRED Embodied Environment (text-based)"
"""How the UniSkill proposer prompt describes the environment."""


def task_description(reset_observation: str) -> str:
    """The text after "Your task is to: " in the reset observation, stripped ("" if absent)."""
    start = reset_observation.find(TASK_PREFIX)
    return reset_observation[start + len(TASK_PREFIX) :].strip() if start != -1 else ""


def format_admissible_actions(actions: Sequence[str]) -> str:
    """verl-agent's list body: quoted actions joined by newline + space, `help` dropped."""
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def constrained_actions(admissible: Sequence[str], instruction: str) -> list[str]:
    """The actions constrained decoding allows: every admissible command except `help`."""
    return [a for a in admissible if a != "help"]


ALFWORLD_PROMPT = PromptPieces(first_template=ALFWORLD_TEMPLATE_NO_HIS, history_template=ALFWORLD_TEMPLATE,
                               format_actions=format_admissible_actions)
