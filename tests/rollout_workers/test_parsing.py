"""verl-agent alfworld_projection semantics; the parser never raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import action_choice

parse_action = rollout_profile("alfworld").parse_action


@pytest.mark.parametrize(
    ("output", "think", "action", "env_action", "valid", "reason"),
    [
        ("<think>go</think><action>go to desk 1</action>", True, "go to desk 1", "go to desk 1", True, None),
        (
            "<think>x</think><action>  Go To Desk 1 \n</action>",
            True,
            "go to desk 1",
            "go to desk 1",
            True,
            None,
        ),
        # first <action> and first </action> win
        ("<think>x</think><action>look</action><action>inventory</action>", True, "look", "look", True, None),
        ("<action>look</action>", False, "look", "look", True, None),
        ("<action>look</action>", True, "look", "look", False, "missing_think_tags"),
        ("<think>x<action>look</action>", True, "look", "look", False, "missing_think_tags"),
        # think tags are checked on the case-preserved output (as upstream)
        ("<THINK>x</THINK><action>look</action>", True, "look", "look", False, "missing_think_tags"),
        ("<ACTION>look</ACTION>", False, "look", "look", True, None),
        ("<think>想</think><action>look</action>", True, "look", "look", False, "cjk_characters"),
        ("<think>x</think><action>   </action>", True, "", "", False, "empty_action"),
        ("</action>junk<action>", False, "", "", False, "empty_action"),
    ],
)
def test_tagged_outputs(output, think, action, env_action, valid, reason):
    parsed = parse_action(output, require_think=think)
    assert (parsed.action, parsed.env_action, parsed.valid, parsed.reason) == (
        action,
        env_action,
        valid,
        reason,
    )


def test_missing_tags_send_last_30_lowercased_chars():
    output = "I think I should Go To The Fridge because it is COLD in there"
    parsed = parse_action(output, require_think=False)
    assert parsed.env_action == output.lower()[-30:]
    assert parsed.action is None and not parsed.valid and parsed.reason == "missing_action_tags"
    only_open = parse_action("<think>a</think><action>look", require_think=True)
    assert (
        only_open.reason == "missing_action_tags"
        and only_open.env_action == "<think>a</think><action>look"[-30:]
    )


def test_action_choice_round_trips():
    parsed = parse_action(action_choice("take mug 1 from countertop 1"), require_think=False)
    assert parsed.valid and parsed.action == "take mug 1 from countertop 1"


tag_soup = st.lists(
    st.one_of(
        st.sampled_from(["<action>", "</action>", "<think>", "</think>", "<ACTION>", "想", " "]),
        st.text(max_size=12),
    ),
    max_size=12,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(output=st.one_of(st.text(), tag_soup), think=st.booleans())
def test_never_raises_and_invariants_hold(output, think):
    parsed = parse_action(output, require_think=think)
    assert (parsed.reason is None) == parsed.valid
    assert parsed.env_action == parsed.env_action.lower()
    if parsed.valid:
        assert parsed.action and parsed.action == parsed.env_action == parsed.action.strip()
    if parsed.action is None:
        assert len(parsed.env_action) <= 30
