"""Action parsing with verl-agent's projection semantics (`alfworld_projection` /
`webshop_projection`; pure, never raises on model output), and the response strings constrained
decoding allows.

- The whole output is lowercased; the action is the text between the first "<action>" and the
  first "</action>", stripped.
- Tags missing: the env receives the last `fallback_chars` characters of the (lowercased)
  output (the environment's `fallback_chars`, `envs.api.EnvPlugin`: ALFWorld 30, WebShop 20,
  as upstream), which the env answers as an invalid action (ALFWorld: "Nothing happens."; WebShop:
  the page is unchanged); the turn is invalid.
- Valid only if both action tags exist, (when think is required) "<think>" and "</think>" both
  occur in the original, case-preserved output, and there is no CJK character (U+4E00-U+9FFF).
- Departure: an empty action (e.g. "<action> </action>", or "</action>" before "<action>") is
  invalid; upstream would send "" as a valid action.
- Admissibility is not checked here: the env answers an inadmissible action with "Nothing
  happens." (as upstream).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CJK = re.compile(r"[\u4e00-\u9fff]")

InvalidReason = Literal["missing_action_tags", "empty_action", "missing_think_tags", "cjk_characters"]


@dataclass(frozen=True)
class ParsedAction:
    """`env_action` is what the env receives; `action` is the text inside the action tags
    (None when the tags are missing); `reason` is None exactly when `valid`."""

    env_action: str
    action: str | None
    valid: bool
    reason: InvalidReason | None


def parse_action(output: str, *, require_think: bool, fallback_chars: int) -> ParsedAction:
    """Project one model output onto an env action (see the module docstring); any `output` is
    accepted. `fallback_chars`: how much of an untagged output the env receives (the env's
    `RolloutEnvProfile.parse_action` passes its own)."""
    lowered = output.lower()
    start, end = lowered.find(ACTION_OPEN), lowered.find(ACTION_CLOSE)
    if start == -1 or end == -1:
        return ParsedAction(lowered[-fallback_chars:], None, False, "missing_action_tags")
    action = lowered[start + len(ACTION_OPEN) : end].strip()
    reason: InvalidReason | None = None
    if not action:
        reason = "empty_action"
    elif require_think and (THINK_OPEN not in output or THINK_CLOSE not in output):
        reason = "missing_think_tags"
    elif _CJK.search(output):
        reason = "cjk_characters"
    return ParsedAction(action, action, reason is None, reason)


def action_choice(action: str) -> str:
    """The full response string that constrained decoding allows for one admissible action."""
    return f"{ACTION_OPEN}{action}{ACTION_CLOSE}"


def constrained_choices(actions: Sequence[str]) -> list[str]:
    """The responses constrained decoding allows for an environment's constrained actions
    (`envs.api.EnvPlugin.constrained_actions`), deduplicated in order."""
    return list(dict.fromkeys(action_choice(a) for a in actions))
