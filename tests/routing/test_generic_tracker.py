"""The generic observation-text tracker (`routing.generic_tracker`): the routing of an environment
that gives SMRC-SD no tracker of its own."""

from __future__ import annotations

from routing.generic_tracker import GenericTracker, observation_digest
from routing.matching import RouteTrace, route
from routing.types import TrackedEpisode

STUDENT = TrackedEpisode(task_id="t", task_type="x", instruction="do it",
                         observations=["Room A.  A door.", "Room B.", "Room A. A door.", "Room C."],
                         actions=["go b", "go a", "go c"])
REFERENCE = TrackedEpisode(task_id="t", task_type="x", instruction="do it",
                           observations=["room a. a  door.", "Room C.", "Done."], actions=["go c", "win"])


def test_signatures_are_digests_of_the_normalised_observation():
    tracker = GenericTracker("echo")
    sigs = tracker.signatures(STUDENT)
    assert len(sigs) == len(STUDENT.observations)
    assert sigs[0] == sigs[2] != sigs[1]  # whitespace and case do not matter, text does
    assert sigs[0].fields == (("observation", observation_digest("room a. a door.")),) and sigs[0].env == "echo"
    assert tracker.signatures(REFERENCE)[0] == sigs[0]
    assert tracker.held(STUDENT) == []
    assert tracker.state_summary(STUDENT, 0, sigs) == {"steps_taken": "0", "last_action": "none"}
    assert tracker.state_summary(STUDENT, 2, sigs) == {"steps_taken": "2", "last_action": "go a"}


def test_the_history_and_observation_matchers_route_on_it():
    student = RouteTrace(actions=STUDENT.actions, observations=STUDENT.observations)
    reference = RouteTrace(actions=REFERENCE.actions, observations=REFERENCE.observations)
    history = route("history", student, reference)
    assert [d.matched for d in history] == [True, False, False]  # the paper's action-prefix matcher
    observed = route("observation", student, reference, "last_visit")
    assert [(d.matched, d.candidate_action) for d in observed] == [(True, "go c"), (False, None), (True, "go c")]
