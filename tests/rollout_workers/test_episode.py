"""`rollout_workers.episode.Episode`, the one view of a finished trajectory (routing and UniSkill
candidate selection), and loading archived trajectories whose records hold retired keys."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from envs.alfworld import tracker as alfworld_tracker
from envs.types import TaskSpec
from envs.webshop.prompts import format_observation
from rollout_workers.episode import Episode
from rollout_workers.proposer import group_members
from rollout_workers.types import Trajectory, Turn

GOAL = "put a clean mug in cabinet."
RESET = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
         f"you see a cabinet 1, a countertop 1, a sinkbasin 1.\n\nYour task is to: {GOAL}")
STEPS = [("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 1."),
         ("take mug 1 from countertop 1", "You pick up the mug 1 from the countertop 1.")]
INSTR = "i need a navy blue shirt, and price lower than 50.00 dollars"
SEARCH = f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
RESULTS = (f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] "
           "B000000001 [SEP] Shirt [SEP] $24.99")


def _turn(observation: str, action: str, next_observation: str, admissible=()) -> Turn:
    return Turn(prompt_ids=(1, 2), response_ids=(3,), sampler_logprobs=(-0.1,), response_text=action,
                action=action, env_action=action, action_valid=True, observation=observation,
                admissible_actions=tuple(admissible), next_observation=next_observation)


def _trajectory(env="alfworld", k=0, success=True) -> Trajectory:
    if env == "alfworld":
        task = TaskSpec(env="alfworld", task_id="t1", task_type="pick_clean_then_place_in_recep", split="train",
                        instruction=GOAL, seed=0)
        observations = [RESET] + [o for _, o in STEPS]
        turns = tuple(_turn(observations[i], a, observations[i + 1]) for i, (a, _) in enumerate(STEPS))
    else:
        task = TaskSpec(env="webshop", task_id="w1", task_type="fashion", split="train", instruction=INSTR, seed=0)
        turns = (_turn(SEARCH, "search[navy blue shirt]", RESULTS, ("search[<your query>]", "click[search]")),)
    return Trajectory(task=task, group_id=f"{task.task_id}@0", traj_id=f"{task.task_id}@0/{k}", turns=turns,
                      success=success, score=10.0 * success, policy_version=1,
                      end_reason="won" if success else "step_limit")


def test_archived_trajectory_with_retired_keys_loads():
    traj = _trajectory()
    record = json.loads(traj.model_dump_json())
    record["skill_bank_version"] = 7
    for turn in record["turns"]:
        turn["signature"] = {"env": "alfworld", "task_id": "t1", "fields": [["stage", "search_obj"]]}
        turn["skill_ids"] = ["skill-1", "skill-2"]
    assert Trajectory.model_validate_json(json.dumps(record)) == traj
    assert Trajectory.model_validate(record) == traj
    record["turns"][0]["not_a_field"] = 1  # anything else is still refused
    with pytest.raises(ValidationError, match="not_a_field"):
        Trajectory.model_validate(record)


def test_episode_view_of_an_alfworld_trajectory():
    traj = _trajectory()
    ep = Episode(traj)
    assert (ep.task_id, ep.traj_id, ep.group_id, ep.success, ep.won) == ("t1", "t1@0/0", "t1@0", True, True)
    assert ep.actions == [a for a, _ in STEPS]
    assert ep.observations == [RESET] + [o for _, o in STEPS]
    assert ep.task_text == GOAL and ep.shown_observations() == ep.observations[:-1]
    trace = ep.trace()
    expected = alfworld_tracker.signatures_for_episode("t1", traj.task.task_type, GOAL, ep.observations, ep.actions)
    assert list(trace.signatures) == expected
    assert ep.state_fields(1, trace) == dict(expected[1].fields)


def test_episode_view_of_a_webshop_trajectory():
    ep = Episode(_trajectory("webshop"))
    assert ep.task_text == INSTR
    assert ep.shown_observations() == [format_observation(SEARCH, INSTR)] == ["'Search'"]
    trace = ep.trace()
    assert [dict(s.fields)["page"] for s in trace.signatures] == ["search", "results"]
    assert ep.state_fields(0, trace) == {"stage": "start", "page": "search", "product": "none", "options": "",
                                         "option_progress": "0/0", "price_ok": "unknown"}


def test_episode_is_the_candidate_selection_member():
    members = [Episode(_trajectory(k=k, success=k < 2)) for k in range(4)]
    (group,) = group_members(members)
    assert [m.won for m in group] == [True, True, False, False]
