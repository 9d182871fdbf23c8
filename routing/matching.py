"""Turn-level routing of a student episode onto a reference successful trajectory (docs/algorithms.md S2).

Conventions (both traces):
- position t is the state the agent sees before acting: `observations[t]`, `signatures[t]`, and the
  action taken there, `actions[t]`;
- a reference position k is routable only when the reference acted there (k < len(actions)), so
  `candidate_action` is always `reference.actions[k]`;
- every matcher returns exactly one RouteDecision per student turn (len(student.actions) turns),
  in order, with `ref_position`/`candidate_action` set iff `matched`.

Matchers (`MATCHERS`, keyed by `MatcherName`):
- "structured": signature equality via a hash map {signature -> positions}; with several positions,
  the smallest k greater than the previous matched k (monotone alignment), else the last occurrence;
- "history": the student's normalised action prefix actions[:t] equals the reference's first t
  actions (so k == t);
- "observation": normalised current observation equality (GiGPO-style anchor), with the same
  monotone tie-break as "structured".

Candidate rules (`CandidateRule`, `method.candidate`): which reference visit of the matched state
the candidate comes from when the reference visits that state more than once (a reference is one
of the policy's own wins, and it wanders):
- "first_visit": the first visit after the previous match (the detour, when the reference left the
  state and came back);
- "last_visit": the last visit after the previous match (the one the reference left for good, so
  its action is the one that led on to the win);
- "loop_erased": the reference with its cycles erased before matching (`loop_erased_positions`):
  a state visited again drops everything between the two visits, so every position left is on
  the reference's final path and a state on it appears once; states that only lie on an erased
  cycle match nothing.
With no visit after the previous match, every rule falls back to the last visit ("last_occurrence").
The rules concern the matchers keyed by state (structured, observation); the history matcher's
states are action prefixes, which never repeat, so all three rules give it the same decisions.
Training's router uses `method.candidate` (default `DEFAULT_CANDIDATE`, last_visit); a `route`
call that names no rule gets the first visit (`UNNAMED_CANDIDATE`).

Instance binding: a signature may name an object by class only (ALFWorld's inventory is "soapbar",
not "soapbar 2"), so a student holding soapbar 1 matches a reference position holding soapbar 2,
and the reference's own action there ("move soapbar 2 to countertop 1") is one the student cannot
execute. Where both traces record the held instance (`RouteTrace.held`), of the same class and
different, the candidate action swaps the two names (`binding`, `bind_action`), under every
candidate rule; the replay audit binds the reference's suffix the same way.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

from routing.types import RouteDecision, StateSignature

MatcherName = Literal["structured", "history", "observation"]
CandidateRule = Literal["first_visit", "last_visit", "loop_erased"]
CANDIDATE_RULES: tuple[CandidateRule, ...] = get_args(CandidateRule)
DEFAULT_CANDIDATE: CandidateRule = "last_visit"
"""`method.candidate`'s default, which training's router uses: the rule fixed in docs/testbed.md
before the measurement ranked last_visit first (tied with loop_erased; docs/results.md, "SMRC-SD
candidate quality")."""
UNNAMED_CANDIDATE: CandidateRule = "first_visit"
"""The rule of a `route` call that names none: the first visit, which the testbed's teacher data
(detour candidates on purpose) and the committed builds and audits were made with."""


def normalize_text(text: str) -> str:
    """Lowercase and collapse all whitespace runs to one space (strips the ends)."""
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class RouteTrace:
    """One episode as seen by a matcher. `signatures`/`observations` may be one longer than
    `actions` (the final observation); matchers only read what they need."""

    actions: Sequence[str]
    observations: Sequence[str] = field(default_factory=tuple)
    signatures: Sequence[StateSignature] = field(default_factory=tuple)
    held: Sequence[str | None] = field(default_factory=tuple)
    """The object instance held before each action ("soapbar 2", None when empty-handed) where the
    env's signature names it by class only; empty for envs without instances (no binding)."""


class Matcher(Protocol):
    def __call__(self, student: RouteTrace, reference: RouteTrace,
                 candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[RouteDecision]: ...


_NO = RouteDecision(matched=False, reason="no_match")


def _held(trace: RouteTrace, position: int) -> str | None:
    return trace.held[position] if position < len(trace.held) else None


def binding(student: RouteTrace, t: int, reference: RouteTrace, k: int) -> dict[str, str]:
    """The instance names to swap in the reference's actions from position k on, so that they
    act on what the student holds at turn t: {ref's, student's} both ways when the two held
    instances are of the same class ("soapbar 2" / "soapbar 1") and differ; else {}."""
    mine, theirs = _held(student, t), _held(reference, k)
    if not mine or not theirs or mine == theirs or mine.rsplit(" ", 1)[0] != theirs.rsplit(" ", 1)[0]:
        return {}
    return {theirs: mine, mine: theirs}


def bind_action(action: str, swap: Mapping[str, str]) -> str:
    """`action` with every whole instance name in `swap` replaced at once ("soapbar 1" is not
    part of "soapbar 10")."""
    if not swap:
        return action
    names = "|".join(re.escape(n) for n in sorted(swap, key=len, reverse=True))
    return re.sub(rf"\b({names})(?!\d)", lambda m: swap[m.group(1)], action)


def _hit(student: RouteTrace, t: int, reference: RouteTrace, k: int, reason: str) -> RouteDecision:
    candidate = bind_action(reference.actions[k], binding(student, t, reference, k))
    return RouteDecision(matched=True, ref_position=k, candidate_action=candidate, reason=reason)


def _require(trace: RouteTrace, attr: str, role: str) -> Sequence[Hashable]:
    values: Sequence[Hashable] = getattr(trace, attr)
    if len(values) < len(trace.actions):
        raise ValueError(f"{role} has {len(values)} {attr} for {len(trace.actions)} actions")
    return values


def loop_erased_positions(keys: Sequence[Hashable]) -> list[int]:
    """The positions of the path `keys` left after erasing its cycles in order (loop erasure): when
    a state recurs, the positions from its earlier visit up to the recurrence are dropped and the
    state is kept at its latest visit. Ascending; no key appears twice among them."""
    kept: list[int] = []
    index: dict[Hashable, int] = {}  # key -> its index in kept
    for k, key in enumerate(keys):
        i = index.get(key)
        if i is not None:
            for dropped in kept[i:]:
                del index[keys[dropped]]
            del kept[i:]
        index[key] = len(kept)
        kept.append(k)
    return kept


def _reference_positions(ref_keys: Sequence[Hashable], n_actions: int, rule: CandidateRule) -> dict[Hashable, list[int]]:
    """{key -> ascending routable positions} of the reference under `rule` (a routable position is
    one where the reference acted; the final state still closes a loop for "loop_erased")."""
    if rule == "loop_erased":
        candidates = [k for k in loop_erased_positions(ref_keys[:n_actions + 1]) if k < n_actions]
    else:
        candidates = list(range(n_actions))
    positions: dict[Hashable, list[int]] = {}
    for k in candidates:
        positions.setdefault(ref_keys[k], []).append(k)
    return positions


def _visit(ks: Sequence[int], prev: int, rule: CandidateRule) -> tuple[int, bool]:
    """The visit among ascending `ks` that `rule` picks after position `prev`, and whether one lay
    after it (else the last visit, the fallback)."""
    i = bisect.bisect_right(ks, prev)
    if i == len(ks):
        return ks[-1], False
    return (ks[-1] if rule == "last_visit" else ks[i]), True


def _monotone(
    student_keys: Sequence[Hashable], ref_keys: Sequence[Hashable], student: RouteTrace, reference: RouteTrace,
    reason: str, rule: CandidateRule,
) -> list[RouteDecision]:
    positions = _reference_positions(ref_keys, len(reference.actions), rule)
    out: list[RouteDecision] = []
    prev = -1
    for t in range(len(student.actions)):
        ks = positions.get(student_keys[t])
        if not ks:
            out.append(_NO)
            continue
        k, after = _visit(ks, prev, rule)
        prev = k
        out.append(_hit(student, t, reference, k, reason if after else f"{reason}:last_occurrence"))
    return out


def match_structured(student: RouteTrace, reference: RouteTrace,
                     candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[RouteDecision]:
    """Signature hash-map matching with monotone alignment."""
    s = _require(student, "signatures", "student")
    r = _require(reference, "signatures", "reference")
    return _monotone(s, r, student, reference, "structured", candidate)


def match_observation(student: RouteTrace, reference: RouteTrace,
                      candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[RouteDecision]:
    """Exact normalised observation equality with monotone alignment."""
    s = [normalize_text(o) for o in _require(student, "observations", "student")]  # type: ignore[arg-type]
    r = [normalize_text(o) for o in _require(reference, "observations", "reference")]  # type: ignore[arg-type]
    return _monotone(s, r, student, reference, "observation", candidate)


def match_history(student: RouteTrace, reference: RouteTrace,
                  candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[RouteDecision]:
    """Match turn t at k = t while the normalised action prefixes agree (once they diverge, never
    again). `candidate` changes nothing: action prefixes never repeat."""
    out: list[RouteDecision] = []
    agree = True
    for t in range(len(student.actions)):
        if t > 0:
            agree = (
                agree
                and t - 1 < len(reference.actions)
                and (normalize_text(student.actions[t - 1]) == normalize_text(reference.actions[t - 1]))
            )
        if agree and t < len(reference.actions):
            out.append(_hit(student, t, reference, t, "history"))
        else:
            out.append(_NO)
    return out


MATCHERS: dict[MatcherName, Matcher] = {
    "structured": match_structured,
    "history": match_history,
    "observation": match_observation,
}


def route(name: MatcherName, student: RouteTrace, reference: RouteTrace | None,
          candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[RouteDecision]:
    """Decisions for every student turn under the candidate rule `candidate`; all unmatched
    (reason "no_reference") without a reference."""
    if candidate not in CANDIDATE_RULES:
        raise ValueError(f"unknown candidate rule {candidate!r}; expected one of {list(CANDIDATE_RULES)}")
    if reference is None:
        return [RouteDecision(matched=False, reason="no_reference") for _ in student.actions]
    try:
        matcher = MATCHERS[name]
    except KeyError:
        raise ValueError(f"unknown matcher {name!r}; expected one of {sorted(MATCHERS)}") from None
    return matcher(student, reference, candidate)


def match_rate(decisions: Sequence[RouteDecision]) -> float:
    """Fraction of matched turns (0.0 for no turns)."""
    return sum(d.matched for d in decisions) / len(decisions) if decisions else 0.0
