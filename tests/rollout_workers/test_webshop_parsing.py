"""WebShop projection (20-character fallback, never raises) and the constrained-decoding choices,
through the env profiles (`rollout_workers.env_profiles`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.webshop.prompts import webshop_search_queries
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import action_choice

WEBSHOP, ALFWORLD = rollout_profile("webshop"), rollout_profile("alfworld")

SYNTHETIC = (
    "i need a slim fit men's dress shirt that is machine washable with color: navy blue, and size: large, "
    "and price lower than 50.00 dollars"
)
HUMAN = "i am looking for a queen sized bed that is black, and price lower than 140.00 dollars"


def test_fallback_length_per_env():
    output = "I would like to Click The Buy Now Button right away"
    assert WEBSHOP.parse_action(output, require_think=False).env_action == output.lower()[-20:]
    assert ALFWORLD.parse_action(output, require_think=False).env_action == output.lower()[-30:]
    parsed = WEBSHOP.parse_action(output, require_think=False)
    assert not parsed.valid and parsed.reason == "missing_action_tags" and parsed.action is None


def test_webshop_actions_are_lowercased_like_upstream():
    parsed = WEBSHOP.parse_action("<think>ok</think><action>click[Buy Now]</action>", require_think=True)
    assert parsed.valid and parsed.env_action == "click[buy now]"


def test_unknown_env_is_a_caller_error():
    with pytest.raises(ValueError, match="env.name='sokoban' is not a registered environment \\(registered: alfworld, .*webshop"):
        rollout_profile("sokoban")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.booleans())
def test_webshop_projection_never_raises(output, think):
    parsed = WEBSHOP.parse_action(output, require_think=think)
    assert parsed.valid == (parsed.reason is None)
    if parsed.action is None:
        assert parsed.env_action == output.lower()[-20:]


def test_search_queries_from_synthetic_and_human_instructions():
    assert webshop_search_queries(SYNTHETIC) == [
        "slim fit men's dress shirt that is machine washable",
        "i need a slim fit men's dress shirt that is machine washable",
        SYNTHETIC,
    ]
    assert webshop_search_queries(HUMAN) == [
        "queen sized bed that is black",
        "i am looking for a queen sized bed that is black",
        HUMAN,
    ]
    assert webshop_search_queries("Find me a [red] hat") == ["red hat", "find me a red hat"]
    assert webshop_search_queries("   ") == []


def test_constrained_choices_replace_the_search_placeholder():
    search_page = ("search[<your query>]", "click[search]")
    assert WEBSHOP.constrained_choices(search_page, HUMAN) == [
        action_choice(f"search[{q}]") for q in webshop_search_queries(HUMAN)
    ] + [action_choice("click[search]")]
    item_page = ("click[back to search]", "click[< prev]", "click[buy now]", "click[navy blue]")
    assert WEBSHOP.constrained_choices(item_page, HUMAN) == [action_choice(a) for a in item_page]
    assert ALFWORLD.constrained_choices(("go to desk 1", "help", "look"), "") == [
        action_choice("go to desk 1"),
        action_choice("look"),
    ]
