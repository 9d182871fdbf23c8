"""The actor's per-turn user message for every environment, rendered from the environment's prompt
pieces (`envs.prompt_pieces.PromptPieces`), and its token ids through the tokenizer's chat template.

History lines follow verl-agent's memory: one line per step, "[Observation k: '<observation shown
before action k>', Action k: '<action sent at step k>']", k absolute, the last `history_length`
steps; observations (current and history) go through the pieces' `format_observation`.

SMRC-SD's teacher prompt: `teacher_context` (a block from `routing.teacher_context`) is inserted
verbatim on its own line(s) right before the line that presents the current observation, in both
templates; with no (or an empty) block the message is byte-identical to the student's. A
`max_history_chars` fallback is decided on the message WITHOUT the teacher block, so a teacher
prompt is always the student's prompt plus the block.

UniSkill's actor prompt: the retrieved skill (`skill_text`) goes in a delimited block
(`render_skill_block`) placed after the task / current-observation header and right before the
"Your admissible actions ..." line, in both templates. The skill text is DATA (written by the
proposer from past trajectories): it is introduced as advice from past experience, stripped, and
any skill tags inside it are neutralised so it cannot close its own block. With no (or an
empty / whitespace-only) skill the message is byte-identical to the environment's template.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from envs.prompt_pieces import ACTIONS_LINE, HIS_OBS_LINE, NO_HIS_OBS_LINE, PromptPieces

K = TypeVar("K")


def split_template(template: str, obs_line: str) -> tuple[str, str, str]:
    """(head, current-observation line, admissible-actions line onwards) of a template: the
    teacher block goes before the middle part, the skill block before the last. `str.format` is
    concatenative over the parts, so head + obs + tail renders exactly as the template."""
    head, rest = template.split(obs_line)
    obs, tail = rest.split(ACTIONS_LINE)
    return head, obs_line + obs, ACTIONS_LINE + tail


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
    the skill stays inside its block whatever the proposer wrote.
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


def render_turn_message(
    pieces: PromptPieces,
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
    """The user message for one turn with an environment's pieces: the first-turn template when
    `history` is empty or `history_length` is 0 (or the history message would exceed the pieces'
    `max_history_chars`), else the history template (verl-agent's `build_text_obs`).

    `current_observation` and the observations in `history` (pairs of the observation shown
    before step k's action and that action) are RAW env observations, formatted here with the
    pieces' `format_observation(obs, task)`. A non-empty `teacher_context` is inserted verbatim
    just before the current-observation line, followed by a newline if it does not already end
    with one; None or "" leaves the message byte-identical to the student's. A non-blank
    `skill_text` (UniSkill) is rendered by `render_skill_block` right before the "Your admissible
    actions ..." line, i.e. after the task, history and current observation.
    """
    skill = render_skill_block(skill_text)
    block = teacher_context or ""
    if block and not block.endswith("\n"):
        block += "\n"
    fmt = pieces.format_observation
    fields: dict[str, object] = {
        "task_description": task,
        "current_observation": fmt(current_observation, task),
        "admissible_actions": pieces.format_actions(admissible_actions),
    }
    parts = split_template(pieces.first_template, NO_HIS_OBS_LINE)
    if history and history_length > 0:
        action_history, shown = format_action_history([(fmt(o, task), a) for o, a in history], history_length)
        his_fields = {**fields, "step_count": len(history), "history_length": shown,
                      "action_history": action_history, "current_step": len(history) + 1}
        his_parts = split_template(pieces.history_template, HIS_OBS_LINE)
        limit = pieces.max_history_chars
        if limit is None or len(_render(his_parts, his_fields, "", skill)) <= limit:
            parts, fields = his_parts, his_fields
    text = _render(parts, fields, block, skill)
    return text if use_think else text.replace(pieces.think_instructions, pieces.action_only_instructions)


def _render(parts: tuple[str, str, str], fields: dict[str, object], block: str, skill: str) -> str:
    head, obs, tail = parts
    return head.format(**fields) + block + obs.format(**fields) + skill + tail.format(**fields)


def render_prompt_ids(tokenizer: ChatTokenizer, user_message: str) -> list[int]:
    """Token ids of [user message] + the assistant generation prompt, via the chat template.

    The template is rendered to text and encoded without extra special tokens, so the ids are
    exactly what the template spells (the same path for every engine and for the learner).
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_prompts(tokenizer: ChatTokenizer, user_messages: Mapping[K, str]) -> dict[K, list[int]]:
    """`render_prompt_ids` of every message, under the same keys."""
    return {key: render_prompt_ids(tokenizer, message) for key, message in user_messages.items()}
