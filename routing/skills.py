"""The Skill-SD and SDAR baselines' teacher context (docs/algorithms.md "Skill-SD and SDAR
baselines"): a skill condensed from earlier experience of the same task, shown to the teacher on
every turn instead of SMRC-SD's state-matched reference. Pure and deterministic, stdlib only; no
model writes the skill.

A skill has two parts, both read from recorded trajectories (never from the env's hidden state):

- the workflow: the env actions of a successful trajectory of the same task (the reference that
  SMRC-SD would pick: `routing.reference.select_reference`), without the actions the env rejected
  and with immediate repeats collapsed ("a (x3)");
- the mistakes: distinct actions the env rejected in the failed trajectories of the same group,
  excluding the student's own trajectory (its future must not leak into its teacher), first
  occurrence order, at most `max_mistakes`.

Layout (the block ends with a newline; "" when there is no workflow):
    [Training-only guidance: a skill condensed from earlier experience of this task]
    Workflow that succeeded (N steps): 'a1' -> 'a2 (x2)' -> ...
    Avoid (rejected in failed attempts): 'm1'; 'm2'
    [End of training-only guidance]
When the block exceeds `max_chars`, workflow steps are dropped oldest first and replaced by "...".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SKILL_HEADER = "[Training-only guidance: a skill condensed from earlier experience of this task]"
SKILL_FOOTER = "[End of training-only guidance]"
WORKFLOW_PREFIX = "Workflow that succeeded"
AVOID_PREFIX = "Avoid (rejected in failed attempts): "


def condense_workflow(steps: Iterable[tuple[str, bool]]) -> list[str]:
    """(env action, accepted by the env) pairs -> workflow items: rejected and empty actions dropped,
    immediate repeats collapsed into one item "a (xN)"."""
    items: list[tuple[str, int]] = []
    for action, valid in steps:
        action = action.strip()
        if not valid or not action:
            continue
        if items and items[-1][0] == action:
            items[-1] = (action, items[-1][1] + 1)
        else:
            items.append((action, 1))
    return [a if n == 1 else f"{a} (x{n})" for a, n in items]


def collect_mistakes(failed: Iterable[Sequence[tuple[str, bool]]], *, max_mistakes: int = 5) -> list[str]:
    """Distinct rejected actions of failed trajectories, first occurrence order, at most `max_mistakes`."""
    out: list[str] = []
    for steps in failed:
        for action, valid in steps:
            action = action.strip()
            if not valid and action and action not in out and len(out) < max_mistakes:
                out.append(action)
    return out


def build_skill_context(workflow: Sequence[str], mistakes: Sequence[str], *, max_chars: int = 6000) -> str:
    """The teacher's skill block ("" without a workflow); see the module docstring for the layout."""
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    if not workflow:
        return ""
    tail = [AVOID_PREFIX + "; ".join(f"'{m}'" for m in mistakes)] if mistakes else []

    def block(shown: Sequence[str], dropped: bool) -> str:
        steps = " -> ".join((["..."] if dropped else []) + [f"'{a}'" for a in shown])
        line = f"{WORKFLOW_PREFIX} ({len(workflow)} steps): {steps}"
        return "\n".join([SKILL_HEADER, line, *tail, SKILL_FOOTER]) + "\n"

    keep = len(workflow)
    while keep > 1 and len(block(workflow[len(workflow) - keep:], keep < len(workflow))) > max_chars:
        keep -= 1
    return block(workflow[len(workflow) - keep:], keep < len(workflow))
