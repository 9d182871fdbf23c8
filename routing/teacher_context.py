"""SMRC-SD's training-only teacher context block (docs/algorithms.md S2 "Teacher context for matched
rows", S8 "context parts"). Pure and deterministic, stdlib only.

The block is inserted verbatim into the student's prompt right before the current observation
(`rollout_workers.prompts.render_turn_message(teacher_context=...)`), and the student's exact
response ids are scored under that prompt. It is built from switchable parts:

- "full_reference": the reference successful trajectory, one line per reference step,
  "Reference step k: observation '<obs before action k>', action '<action k>'" (k from 1);
- "state_summary": "Current state: stage=<stage>, holding <inventory|nothing>, at <location>"
  (a deterministic template of the current state-signature fields, see `format_state_summary`);
- "candidate_action": "Suggested next action (from the matching step of the reference): '<a>'".

Layout (each present piece on its own line, in this order):
    [Training-only guidance: a successful attempt at this same task]
    (N earlier reference steps omitted)          <- only when the budget dropped steps
    Reference step k: observation '...', action '...'
    ...
    Current state: stage=..., holding ..., at ...
    Suggested next action (from the matching step of the reference): '...'
    [End of training-only guidance]
The block ends with a newline. A part whose input is missing (no candidate on an unmatched turn,
no state fields, an empty reference) is simply omitted; if nothing is left the result is "".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

ContextPart = Literal["full_reference", "state_summary", "candidate_action"]
CONTEXT_PARTS: frozenset[str] = frozenset(get_args(ContextPart))

HEADER = "[Training-only guidance: a successful attempt at this same task]"
FOOTER = "[End of training-only guidance]"
CANDIDATE_PREFIX = "Suggested next action (from the matching step of the reference): "
STATE_PREFIX = "Current state: "

# Signature fields rendered in this fixed order; any other field follows as key=value, sorted.
_KNOWN_FIELDS = ("task_type", "stage", "inventory", "location", "target_seen")


def format_reference_step(k: int, observation: str, action: str) -> str:
    """One reference line, k counted from 1 (the same quoting as the prompt's history lines)."""
    return f"Reference step {k}: observation '{observation}', action '{action}'"


def format_state_summary(state_fields: Mapping[str, str]) -> str:
    """'Current state: stage=<s>, holding <inv>, at <loc>' from tracker `fields()`.

    Missing fields are skipped; inventory "none" reads "holding nothing". `task_type` and
    `target_seen` are not shown (the task text already says the former; the latter is a routing
    detail); any unknown extra field is appended as ", key=value" in sorted key order.
    Returns "" when nothing would be shown.
    """
    pieces: list[str] = []
    if state_fields.get("stage"):
        pieces.append(f"stage={state_fields['stage']}")
    if state_fields.get("inventory"):
        inv = state_fields["inventory"]
        pieces.append(f"holding {'nothing' if inv == 'none' else inv}")
    if state_fields.get("location"):
        pieces.append(f"at {state_fields['location']}")
    for key in sorted(k for k in state_fields if k not in _KNOWN_FIELDS):
        if state_fields[key]:
            pieces.append(f"{key}={state_fields[key]}")
    return STATE_PREFIX + ", ".join(pieces) if pieces else ""


def build_teacher_context(
    *,
    parts: frozenset[ContextPart],
    reference_observations: Sequence[str],
    reference_actions: Sequence[str],
    state_fields: Mapping[str, str] | None,
    candidate_action: str | None,
    max_chars: int = 6000,
) -> str:
    """The teacher block for one turn ("" when `parts` is empty or every selected part is missing).

    Reference steps pair `reference_observations[k-1]` (the observation shown before action k)
    with `reference_actions[k-1]`; a trailing post-action observation (len(observations) ==
    len(actions) + 1) is not shown.

    Budget rule: `max_chars` bounds the length of the whole returned block. The header, footer,
    state summary and candidate action are always kept; reference steps are dropped oldest first
    (whole lines, never cut mid-line), replaced by one "(N earlier reference steps omitted)" line,
    until the block fits, so the final steps of the reference survive. If not even the last step
    fits, no reference line is shown (only the omission line). The block can exceed `max_chars`
    only when the always-kept lines plus that omission line alone do.
    """
    unknown = set(parts) - CONTEXT_PARTS
    if unknown:
        raise ValueError(f"unknown teacher-context parts: {sorted(unknown)}")
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    n_obs, n_act = len(reference_observations), len(reference_actions)
    if "full_reference" in parts and n_obs not in (n_act, n_act + 1):
        raise ValueError(f"reference has {n_obs} observations for {n_act} actions")

    steps: list[str] = []
    if "full_reference" in parts:
        steps = [
            format_reference_step(k + 1, reference_observations[k], reference_actions[k])
            for k in range(n_act)
        ]
    tail: list[str] = []
    if "state_summary" in parts and state_fields:
        summary = format_state_summary(state_fields)
        if summary:
            tail.append(summary)
    if "candidate_action" in parts and candidate_action:
        tail.append(f"{CANDIDATE_PREFIX}'{candidate_action}'")
    if not steps and not tail:
        return ""

    def block(shown: list[str], omitted: int) -> str:
        lines = [HEADER, _omission_line(omitted)] if omitted else [HEADER]
        return "\n".join([*lines, *shown, *tail, FOOTER]) + "\n"

    # Drop the oldest steps until the block fits (lengths are additive, so count directly).
    fixed = len(block([], 0))
    used = fixed
    keep = 0
    for line in reversed(steps):
        omitted = len(steps) - keep - 1
        omit_len = len(_omission_line(omitted)) + 1 if omitted else 0
        if used + len(line) + 1 + omit_len > max_chars:
            break
        used += len(line) + 1
        keep += 1
    shown = steps[len(steps) - keep :]
    return block(shown, len(steps) - keep)


def _omission_line(n: int) -> str:
    return f"({n} earlier reference step{'' if n == 1 else 's'} omitted)"
