"""The candidate rules (first visit, last visit, loop-erased) on hand-built references."""

from __future__ import annotations

import pytest

from routing.matching import CANDIDATE_RULES, RouteTrace, loop_erased_positions, route
from routing.types import StateSignature


def sig(name: str) -> StateSignature:
    return StateSignature(env="alfworld", task_id="t", fields=(("state", name),))


def trace(states: str, held: list[str | None] | None = None, actions: list[str] | None = None) -> RouteTrace:
    """One letter per position; actions 'a<i>' unless given."""
    acts = actions if actions is not None else [f"a{i}" for i in range(len(states))]
    return RouteTrace(actions=acts, observations=[f"obs {c}" for c in states],
                      signatures=[sig(c) for c in states], held=held or [])


def positions(states: str, ref: RouteTrace, rule: str, matcher: str = "structured") -> list[int | None]:
    return [d.ref_position for d in route(matcher, trace(states), ref, rule)]  # type: ignore[arg-type]


def test_loop_erasure_by_hand() -> None:
    assert loop_erased_positions("abcd") == [0, 1, 2, 3]
    assert loop_erased_positions("abxbc") == [0, 3, 4]  # b, x, b: the b..b cycle goes, b kept at 3
    assert loop_erased_positions("abcabd") == [3, 4, 5]  # a b c a: back to the start
    # nested: b-c-b and b-d-b inside a-...-a; only the last a and e are on the final path
    assert loop_erased_positions("abcbdbae") == [6, 7]
    assert loop_erased_positions("abcbad") == [4, 5]
    assert loop_erased_positions("") == []


def test_a_state_visited_twice() -> None:
    ref = trace("abxbc")  # a0 b1 x2 b3 c4: the first b's action leads to the detour x
    assert positions("abc", ref, "first_visit") == [0, 1, 4]
    assert positions("abc", ref, "last_visit") == [0, 3, 4]
    assert positions("abc", ref, "loop_erased") == [0, 3, 4]
    # x lies on the erased cycle only: loop-erased leaves it unmatched
    assert positions("axc", ref, "first_visit") == [0, 2, 4]
    assert positions("axc", ref, "last_visit") == [0, 2, 4]
    assert positions("axc", ref, "loop_erased") == [0, None, 4]


def test_a_loop_back_to_the_start() -> None:
    ref = trace("abcabd")  # a0 b1 c2 a3 b4 d5
    assert positions("abd", ref, "first_visit") == [0, 1, 5]
    assert positions("abd", ref, "last_visit") == [3, 4, 5]
    assert positions("abd", ref, "loop_erased") == [3, 4, 5]
    # the student walks the reference's own loop
    assert positions("abcabd", ref, "first_visit") == [0, 1, 2, 3, 4, 5]
    # last visit: c (only at 2) comes after the previous match 4, so it falls back to its last visit
    # and the alignment restarts from there
    assert positions("abcabd", ref, "last_visit") == [3, 4, 2, 3, 4, 5]
    out = route("structured", trace("abcabd"), ref, "last_visit")
    assert out[2].reason == "structured:last_occurrence" and out[3].reason == "structured"
    assert positions("abcabd", ref, "loop_erased") == [3, 4, None, 3, 4, 5]


def test_nested_loops() -> None:
    ref = trace("abcbdbae")  # a0 b1 c2 b3 d4 b5 a6 e7
    assert positions("abe", ref, "first_visit") == [0, 1, 7]
    assert positions("abe", ref, "last_visit") == [6, 5, 7]  # b's visits all lie before a's last
    assert positions("abe", ref, "loop_erased") == [6, None, 7]
    assert [d.candidate_action for d in route("structured", trace("abe"), ref, "loop_erased")] == ["a6", None, "a7"]


def test_the_final_state_closes_a_loop() -> None:
    # two actions, three states: a -> b -> a; the whole path is a cycle, nothing routable is left
    ref = RouteTrace(actions=["a0", "a1"], observations=["obs a", "obs b", "obs a"],
                     signatures=[sig("a"), sig("b"), sig("a")])
    assert positions("ab", ref, "loop_erased") == [None, None]
    assert positions("ab", ref, "first_visit") == [0, 1]


def test_observation_matcher_follows_the_rule_and_history_ignores_it() -> None:
    ref = trace("abxbc")
    assert positions("abc", ref, "last_visit", "observation") == [0, 3, 4]
    assert positions("abc", ref, "first_visit", "observation") == [0, 1, 4]
    student = trace("abxbc")
    for rule in CANDIDATE_RULES:
        assert [d.ref_position for d in route("history", student, ref, rule)] == [0, 1, 2, 3, 4]


def test_binding_to_the_held_instance_under_every_rule() -> None:
    # the reference holds soapbar 2 throughout; its second visit of a puts it down
    ref = trace("abac", held=["soapbar 2"] * 4,
                actions=["go to cabinet 1", "go to countertop 1", "move soapbar 2 to countertop 1", "look"])
    student = trace("ac", held=["soapbar 1", "soapbar 1"], actions=["x", "y"])
    candidates = {rule: route("structured", student, ref, rule)[0].candidate_action for rule in CANDIDATE_RULES}
    assert candidates == {"first_visit": "go to cabinet 1", "last_visit": "move soapbar 1 to countertop 1",
                          "loop_erased": "move soapbar 1 to countertop 1"}


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown candidate rule"):
        route("structured", trace("a"), trace("a"), "middle_visit")  # type: ignore[arg-type]
