"""Action parsing with verl-agent's `alfworld_projection` / `webshop_projection` semantics (pure;
never raises on model output), and the response strings constrained decoding allows.

- The whole output is lowercased; the action is the text between the first "<action>" and the
  first "</action>", stripped.
- Tags missing: the env receives the last `fallback_chars` characters of the (lowercased)
  output (the env's length, `rollout_workers.env_profiles`: ALFWorld 30, WebShop 20, as
  upstream), which the env answers as an invalid action (ALFWorld: "Nothing happens."; WebShop:
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


# ---- constrained decoding: the admissible responses per env ------------------------------------
WEBSHOP_SEARCH_PLACEHOLDER = "search[<your query>]"
_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.,]+ dollars\.?\s*$")
_OPTIONS_CLAUSE = re.compile(r"\s+with\s+[^,:]+:\s.*$")
_REQUEST_PREFIX = re.compile(
    r"^(?:i am looking for|i'm looking for|i am searching for|looking for|i would like|i'd like|"
    r"i need|i want|find me|get me|buy me|show me|search for)\s+"
)
_ARTICLES = frozenset({"a", "an", "the", "some"})


def webshop_search_queries(instruction: str) -> list[str]:
    """Search queries derived from a WebShop instruction, most specific last (deduplicated):

    1. keywords: the product phrase without the request prefix ("i need", "i am looking for", ...)
       and without articles;
    2. the product phrase: the instruction without its "with k: v, and k2: v2" options clause
       and its ", and price lower than P dollars" clause;
    3. the whole instruction.

    All lowercased (the projection lowercases actions anyway), brackets removed (they would end
    the `search[...]` argument), whitespace collapsed. [] for an empty instruction.
    """
    full = " ".join(instruction.lower().replace("[", " ").replace("]", " ").split())
    phrase = _OPTIONS_CLAUSE.sub("", _PRICE_CLAUSE.sub("", full)).strip(" ,.")
    words = [w for w in _REQUEST_PREFIX.sub("", phrase).split() if w not in _ARTICLES]
    return list(dict.fromkeys(q for q in (" ".join(words), phrase, full) if q))


def alfworld_choices(admissible: Sequence[str], instruction: str) -> list[str]:
    """ALFWorld's constrained responses: every admissible command except `help`."""
    return [action_choice(a) for a in admissible if a != "help"]


def webshop_choices(admissible: Sequence[str], instruction: str) -> list[str]:
    """WebShop's constrained responses: every `click[...]`; in place of the free-text
    "search[<your query>]" (offered when the page has a search bar), one `search[q]` per query of
    `webshop_search_queries(instruction)`. Free text cannot be constrained here because both
    engines constrain to a finite choice list (the HF engine's token trie; vLLM's `choice`
    structured output, whose allowed ids are replayed from the same trie), so WebShop searches
    are limited to those instruction-derived queries.
    """
    out = []
    for a in admissible:
        if a == WEBSHOP_SEARCH_PLACEHOLDER:
            out += [action_choice(f"search[{q}]") for q in webshop_search_queries(instruction)]
        else:
            out.append(action_choice(a))
    return list(dict.fromkeys(out))
