"""The three matchers on crafted trajectories."""

from __future__ import annotations

import pytest

from routing.matching import MATCHERS, RouteTrace, match_rate, normalize_text, route
from routing.types import StateSignature


def sig(name: str) -> StateSignature:
    return StateSignature(env="alfworld", task_id="t", fields=(("state", name),))


def trace(states: str, actions: list[str] | None = None, observations: list[str] | None = None) -> RouteTrace:
    """states: one letter per position; default actions 'a<i>' and observations 'obs <letter>'."""
    acts = actions if actions is not None else [f"a{i}" for i in range(len(states))]
    obs = observations if observations is not None else [f"obs {c}" for c in states]
    return RouteTrace(actions=acts, observations=obs, signatures=[sig(c) for c in states])


def test_registry_and_no_reference() -> None:
    assert set(MATCHERS) == {"structured", "history", "observation"}
    out = route("structured", trace("ab"), None)
    assert [d.matched for d in out] == [False, False] and out[0].reason == "no_reference"
    with pytest.raises(ValueError):
        route("nope", trace("a"), trace("a"))  # type: ignore[arg-type]


def test_structured_identical_trajectory_matches_everywhere() -> None:
    ref = trace("abcd")
    out = route("structured", ref, ref)
    assert [d.ref_position for d in out] == [0, 1, 2, 3]
    assert [d.candidate_action for d in out] == ["a0", "a1", "a2", "a3"]


def test_structured_detour_and_loop() -> None:
    ref = trace("abcd")
    student = trace("axbxbcd")  # detour x (unknown) and a loop back to b
    out = route("structured", student, ref)
    assert [d.ref_position for d in out] == [0, None, 1, None, 1, 2, 3]
    assert out[4].reason.endswith("last_occurrence")  # b seen again: no k > 1, falls back to last b
    assert [d.matched for d in out] == [True, False, True, False, True, True, True]
    assert match_rate(out) == pytest.approx(5 / 7)


def test_structured_monotone_alignment_on_repeated_reference_states() -> None:
    ref = trace("abab c".replace(" ", ""))  # positions: a0 b1 a2 b3 c4
    out = route("structured", trace("abababc"), ref, "first_visit")
    assert [d.ref_position for d in out] == [0, 1, 2, 3, 2, 3, 4]
    assert out[4].reason == "structured:last_occurrence"
    assert [d.candidate_action for d in out][:4] == ["a0", "a1", "a2", "a3"]


def test_structured_different_subgoal_order_still_matches_states() -> None:
    ref = trace("sabcd")
    out = route("structured", trace("sbacd"), ref)
    # b is found after position 0, then a has no later occurrence: last occurrence (1), then c, d
    assert [d.ref_position for d in out] == [0, 2, 1, 3, 4]
    hist = route("history", trace("sbacd", actions=["a0", "x", "y", "a3", "a4"]), ref)
    assert [d.matched for d in hist] == [True, True, False, False, False]


def test_reference_final_position_without_action_is_not_routable() -> None:
    ref = RouteTrace(actions=["go"], signatures=[sig("a"), sig("z")], observations=["o a", "o z"])
    out = route("structured", trace("az"), ref)
    assert [d.ref_position for d in out] == [0, None]


def test_history_prefix_matching_with_normalisation() -> None:
    ref = trace(
        "abcd",
        actions=[
            "go to desk 1",
            "take mug 1 from desk 1",
            "go to sinkbasin 1",
            "clean mug 1 with sinkbasin 1",
        ],
    )
    student = trace(
        "abcd", actions=["Go  to desk 1", "take mug 1 from desk 1 ", "go to cabinet 1", "go to sinkbasin 1"]
    )
    out = route("history", student, ref)
    assert [d.ref_position for d in out] == [0, 1, 2, None]
    assert out[2].candidate_action == "go to sinkbasin 1"


def test_history_loop_never_rematches_after_divergence() -> None:
    ref = trace("ab", actions=["x", "y"])
    student = trace("aaab", actions=["z", "look", "x", "y"])
    assert [d.matched for d in route("history", student, ref)] == [True, False, False, False]


def test_history_student_longer_than_reference() -> None:
    ref = trace("ab", actions=["x", "y"])
    out = route("history", trace("abc", actions=["x", "y", "z"]), ref)
    assert [d.matched for d in out] == [True, True, False]


def test_observation_matcher_normalises_and_is_monotone() -> None:
    ref = trace("abc", observations=["You see A.", "Nothing  happens.", "Nothing happens."])
    student = trace(
        "xyzw", observations=["you see a.", "nothing happens.", "NOTHING happens.", "nothing happens."]
    )
    out = route("observation", student, ref, "first_visit")
    assert [d.ref_position for d in out] == [0, 1, 2, 2]
    assert [d.ref_position for d in route("observation", student, ref, "last_visit")] == [0, 2, 2, 2]
    assert normalize_text("  A\n b\tC ") == "a b c"


def test_structured_requires_signatures() -> None:
    with pytest.raises(ValueError):
        route("structured", RouteTrace(actions=["a"]), trace("a"))


def test_candidate_is_bound_to_the_instance_the_student_holds():
    from routing.matching import bind_action, binding

    def held(*names):
        return RouteTrace(actions=["a"] * len(names), held=list(names))

    assert binding(held("soapbar 1"), 0, held("soapbar 2"), 0) == {"soapbar 2": "soapbar 1", "soapbar 1": "soapbar 2"}
    assert binding(held("soapbar 1"), 0, held("soapbar 1"), 0) == {}  # the same instance
    assert binding(held("soapbar 1"), 0, held("candle 2"), 0) == {}  # another class: nothing to bind
    assert binding(held(None), 0, held("soapbar 2"), 0) == {} == binding(RouteTrace(actions=["a"]), 0, held("x 1"), 0)
    swap = {"soapbar 2": "soapbar 1", "soapbar 1": "soapbar 2"}
    assert bind_action("move soapbar 2 to countertop 1", swap) == "move soapbar 1 to countertop 1"
    assert bind_action("take soapbar 1 from soapbar 10", swap) == "take soapbar 2 from soapbar 10"  # whole names, once
    assert bind_action("go to countertop 2", swap) == "go to countertop 2" == bind_action("go to countertop 2", {})

    ref = RouteTrace(actions=["take soapbar 2 from sink 1", "move soapbar 2 to shelf 1"],
                     signatures=[sig("s"), sig("h")], held=[None, "soapbar 2"])
    student = RouteTrace(actions=["take soapbar 1 from sink 1", "look"], signatures=[sig("s"), sig("h")],
                         held=[None, "soapbar 1"])
    for name in ("structured", "history"):
        d = route(name, student, ref)
        assert d[1].candidate_action == "move soapbar 1 to shelf 1" if name == "structured" else not d[1].matched
        assert d[0].candidate_action == "take soapbar 2 from sink 1"  # empty-handed: the reference's own action
