"""Per-env trackers through the environment interface (`routing.trackers`): each built-in env's
signatures and state summary, and a clear error for an unregistered env."""

from __future__ import annotations

import pytest

from envs.alfworld import tracker as alfworld_tracker
from envs.webshop import tracker as webshop_tracker
from routing.trackers import has_tracker, tracker_profile
from routing.types import TrackedEpisode

INSTR = "i need a shirt with color: navy blue, and price lower than 50.00 dollars"
HEAD = f"Instruction: [SEP] {INSTR} [SEP] Back to Search"
SEARCH = f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
RESULTS = f"{HEAD} [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] B000000001 [SEP] Shirt [SEP] $24.99"
ITEM = (f"{HEAD} [SEP] < Prev [SEP] color [SEP] navy blue [SEP] white [SEP] Shirt [SEP] Price: $24.99 [SEP] "
        "Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
ITEM_ACTIONS = ("click[back to search]", "click[< prev]", "click[buy now]", "click[navy blue]", "click[white]")
WEBSHOP = TrackedEpisode(
    task_id="w1", task_type="fashion", instruction=INSTR,
    observations=[SEARCH, RESULTS, ITEM, ITEM],
    actions=["search[shirt]", "click[b000000001]", "click[navy blue]"],
    admissible=[("search[<your query>]", "click[search]"), ("click[b000000001]",), ITEM_ACTIONS])


def test_one_profile_per_env_and_a_clear_error_otherwise():
    for env in ("alfworld", "webshop"):
        assert has_tracker(env) and tracker_profile(env).env == env and not tracker_profile(env).generic
    with pytest.raises(ValueError, match="env.name='sokoban' is not a registered environment"):
        tracker_profile("sokoban")


def test_alfworld_profile_is_the_tracker_and_its_exact_fields():
    goal = "put a clean mug in cabinet."
    ep = TrackedEpisode(task_id="t1", task_type="", instruction=goal,
                        observations=[f"You are in the middle of a room.\n\nYour task is to: {goal}",
                                      "You arrive at countertop 1. On the countertop 1, you see a mug 1, and a mug 2.",
                                      "You pick up the mug 2 from the countertop 1."],
                        actions=["go to countertop 1", "take mug 2 from countertop 1"])
    profile = tracker_profile("alfworld")
    sigs = profile.signatures(ep)
    assert sigs == alfworld_tracker.signatures_for_episode("t1", "", goal, ep.observations, ep.actions)
    assert profile.state_summary(ep, 1, sigs) == dict(sigs[1].fields)
    # the signature keeps the held class, `held` the instance (for binding a reference's actions)
    assert dict(sigs[2].fields)["inventory"] == "mug" and profile.held(ep) == [None, None, "mug 2"]


def test_webshop_profile_reads_admissible_actions_and_summarises_progress():
    profile = tracker_profile("webshop")
    sigs = profile.signatures(WEBSHOP)
    assert sigs == webshop_tracker.signatures_for_episode("w1", "fashion", INSTR, WEBSHOP.observations,
                                                          WEBSHOP.actions, admissible=WEBSHOP.admissible)
    assert dict(sigs[3].fields)["options"] == "color=navy blue" and profile.held(WEBSHOP) == []
    assert profile.state_summary(WEBSHOP, 1, sigs) == {
        "stage": "searched", "page": "results", "product": "none", "options": "", "option_progress": "0/1",
        "price_ok": "unknown"}
    assert profile.state_summary(WEBSHOP, 3, sigs) == {
        "stage": "options_set", "page": "item", "product": "b000000001", "options": "color=navy blue",
        "option_progress": "1/1", "price_ok": "true"}
