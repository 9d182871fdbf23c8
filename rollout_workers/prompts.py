"""verl-agent's ALFWorld prompt, rendered to token ids through the tokenizer's chat template.

The template text is verl-agent's, character for character (leading and trailing newline, the
space after "tags." and the upstream typo "observaitons" included), because the published
numbers were obtained with it. History lines follow verl-agent's memory: one line per step,
"[Observation k: '<observation shown before action k>', Action k: '<action sent at step k>']",
k absolute, the last `history_length` steps. Admissible actions are listed without `help`.

Departure: `use_think=False` swaps the two closing instructions for one asking only for the
action tag (the tiny laptop model, which cannot reason). Everything else is identical.

SMRC-SD's teacher prompt: `teacher_context` (a block from `routing.teacher_context`) is inserted
verbatim on its own line(s) right before the line that presents the current observation, in both
templates; with no (or an empty) block the message is byte-identical to the student's.

UniSkill's actor prompt: the retrieved skill (`skill_text`) goes in a delimited block
(`render_skill_block`) placed after the task / current-observation header and right before the
"Your admissible actions ..." line, in both templates. The skill text is DATA (written by the
proposer from past trajectories): it is introduced as advice from past experience, stripped, and
any skill tags inside it are neutralised so it cannot close its own block. With no (or an
empty / whitespace-only) skill the message is byte-identical to verl-agent's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

TASK_PREFIX = "Your task is to: "

_THINK_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags.\n"
)
_ACTION_ONLY_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should choose an admissible action for current step and present it within "
    "<action> </action> tags.\n"
)

ALFWORLD_TEMPLATE_NO_HIS = (
    "\n"
    "You are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n"
    "\n" + _THINK_INSTRUCTIONS
)
ALFWORLD_TEMPLATE = (
    "\n"
    "You are an expert agent operating in the ALFRED Embodied Environment. "
    "Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observaitons and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n"
    "\n" + _THINK_INSTRUCTIONS
)


# Each template split in three: head | current-observation line | admissible-actions line onwards.
# The teacher block goes before the observation line, the skill block before the actions line.
# `str.format` is concatenative over the parts, so head + obs + tail renders exactly as the template.
# verl-agent's ALFWorld and WebShop templates share these lines (prompts_webshop uses them too).
NO_HIS_OBS_LINE = "Your current observation is: "
HIS_OBS_LINE = "You are now at step {current_step} and your current observation is: "
ACTIONS_LINE = "Your admissible actions of the current situation are: "


def split_template(template: str, obs_line: str) -> tuple[str, str, str]:
    """(head, current-observation line, admissible-actions line onwards) of a verl-agent template."""
    head, rest = template.split(obs_line)
    obs, tail = rest.split(ACTIONS_LINE)
    return head, obs_line + obs, ACTIONS_LINE + tail


_NO_HIS_HEAD, _NO_HIS_OBS, _NO_HIS_TAIL = split_template(ALFWORLD_TEMPLATE_NO_HIS, NO_HIS_OBS_LINE)
_HIS_HEAD, _HIS_OBS, _HIS_TAIL = split_template(ALFWORLD_TEMPLATE, HIS_OBS_LINE)

SKILL_OPEN, SKILL_CLOSE = "<skill>", "</skill>"
SKILL_INTRO = (
    "The following skill is advice distilled from past experience on similar tasks. It may be "
    "incomplete or wrong; use it only if it helps with the current situation."
)


def render_skill_block(skill_text: str | None) -> str:
    """The actor-prompt block for a retrieved skill ("" when there is none), ending in a newline:

        <SKILL_INTRO>
        <skill>
        ...skill text...
        </skill>

    The text is stripped, and "<skill>" / "</skill>" inside it become "[skill]" / "[/skill]", so
    the skill stays inside its block whatever the proposer wrote. Shared by every env's templates
    (ALFWorld here, WebShop in prompts_webshop).
    """
    quoted = quote_skill(skill_text)
    return f"{SKILL_INTRO}\n{quoted}" if quoted else ""


def quote_skill(skill_text: str | None) -> str:
    """The tagged skill, "<skill>", text, "</skill>" on their own lines ("" for a blank skill): the
    text stripped, skill tags inside it neutralised (case-insensitively) so it cannot close its
    own block. Used by the actor's block and the proposer prompt."""
    text = (skill_text or "").strip()
    if not text:
        return ""
    for tag, safe in ((SKILL_OPEN, "[skill]"), (SKILL_CLOSE, "[/skill]")):
        text = _replace_ci(text, tag, safe)
    return f"{SKILL_OPEN}\n{text}\n{SKILL_CLOSE}\n"


def _replace_ci(text: str, old: str, new: str) -> str:
    """`text` with every case-insensitive occurrence of `old` replaced by `new`. Matched in the
    text itself: offsets into `text.lower()` drift where a character lowercases to two ("\u0130")."""
    return re.sub(re.escape(old), lambda _m: new, text, flags=re.IGNORECASE)


class ChatTokenizer(Protocol):
    """The slice of a HF tokenizer that prompt rendering needs."""

    def apply_chat_template(self, conversation, **kwargs): ...

    def encode(self, text: str, **kwargs) -> list[int]: ...


def task_description(reset_observation: str) -> str:
    """The text after "Your task is to: " in the reset observation, stripped ("" if absent)."""
    start = reset_observation.find(TASK_PREFIX)
    return reset_observation[start + len(TASK_PREFIX) :].strip() if start != -1 else ""


def format_admissible_actions(actions: Sequence[str]) -> str:
    """verl-agent's list body: quoted actions joined by newline + space, `help` dropped."""
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def format_action_history(history: Sequence[tuple[str, str]], history_length: int) -> tuple[str, int]:
    """Lines for the last `history_length` (observation, action) pairs and how many there are.

    `history[k-1]` holds the observation shown before step k's action and that action.
    """
    recent = list(history[-history_length:]) if history_length > 0 else []
    first = len(history) - len(recent) + 1
    lines = [
        f"[Observation {first + j}: '{obs}', Action {first + j}: '{act}']"
        for j, (obs, act) in enumerate(recent)
    ]
    return "\n".join(lines), len(recent)


def render_alfworld_message(
    *,
    task: str,
    current_observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[tuple[str, str]],
    history_length: int,
    use_think: bool,
    skill_text: str | None = None,
    teacher_context: str | None = None,
) -> str:
    """The user message for one turn: the first-step template when `history` is empty or
    `history_length` is 0, else the history template (verl-agent's `build_text_obs`).

    A non-empty `teacher_context` is inserted verbatim just before the current-observation line
    ("Your current observation is: ..." / "You are now at step N and your current observation
    is: ..."), followed by a newline if it does not already end with one. None or "" leaves the
    message byte-identical to the student's.

    A non-blank `skill_text` (UniSkill) is rendered by `render_skill_block` right before the
    "Your admissible actions ..." line, i.e. after the task, history and current observation.
    """
    skill = render_skill_block(skill_text)
    block = teacher_context or ""
    if block and not block.endswith("\n"):
        block += "\n"
    actions = format_admissible_actions(admissible_actions)
    if not history or history_length <= 0:
        fields = {"current_observation": current_observation, "admissible_actions": actions}
        head, obs, tail = _NO_HIS_HEAD, _NO_HIS_OBS, _NO_HIS_TAIL
    else:
        action_history, shown = format_action_history(history, history_length)
        fields = {
            "task_description": task,
            "step_count": len(history),
            "history_length": shown,
            "action_history": action_history,
            "current_step": len(history) + 1,
            "current_observation": current_observation,
            "admissible_actions": actions,
        }
        head, obs, tail = _HIS_HEAD, _HIS_OBS, _HIS_TAIL
    text = head.format(**fields) + block + obs.format(**fields) + skill + tail.format(**fields)
    return text if use_think else text.replace(_THINK_INSTRUCTIONS, _ACTION_ONLY_INSTRUCTIONS)


def render_prompt_ids(tokenizer: ChatTokenizer, user_message: str) -> list[int]:
    """Token ids of [user message] + the assistant generation prompt, via the chat template.

    The template is rendered to text and encoded without extra special tokens, so the ids are
    exactly what the template spells (the same path for every engine and for the learner).
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))
