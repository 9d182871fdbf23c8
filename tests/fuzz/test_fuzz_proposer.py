"""The UniSkill proposer's output (op token in action tags + skill text) and the trajectory text
its prompt is built from.

Properties: any text parses without an exception into either a proposal or one of the documented
reasons; an accepted ADD/UPDATE carries non-empty, stripped skill text within the length limit;
UPDATE is accepted only where legal; a well-formed output round-trips its op and skill text; the
rendered trajectory never exceeds its character budget.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from rollout_workers.proposer import (
    OP_TOKENS,
    OPS,
    ProposalInvalid,
    parse_proposal,
    render_trajectory,
)

FUZZ = fuzz_settings(400)
REASONS = set(typing.get_args(ProposalInvalid))
CLASS = "proposer output"

FRAGMENTS = st.sampled_from([
    *OP_TOKENS, "<action>", "</action>", "<ACTION>", "</Action>", "<skill>", "</skill>", "<SKILL>", "</Skill>",
    "no_skill", "ADD_SKILL", " ", "\n", "\u3000", "\u4e2d", "\u0130", "<think>", "</think>", "<|im_end|>",
    "Open closed receptacles before searching them.", "\x00", "\u200b",
])
OUTPUT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(FRAGMENTS, st.text(max_size=10)), max_size=10).map("".join),
)
LEGAL = st.tuples(st.just(True), st.just(True), st.booleans())


@FUZZ
@given(text=OUTPUT, legal=LEGAL, prefilled=st.booleans(),
       max_chars=st.one_of(st.none(), st.integers(1, 300)))
def test_any_proposer_output_parses_or_names_a_reason(fuzz_cases, text, legal, prefilled, max_chars):
    fuzz_cases(CLASS)
    p = parse_proposal(text, legal=legal, prefilled=prefilled, max_skill_chars=max_chars)
    assert (p.reason is None) == p.ok
    if not p.ok:
        assert p.reason in REASONS
    if p.op is None:
        assert p.reason in ("missing_action_tags", "unknown_op") and not p.ok
    else:
        assert p.op in OPS
    if p.reason == "illegal_update":
        assert p.op == "update" and not legal[2]
    if p.ok and p.op in ("add", "update"):
        assert p.skill_text and p.skill_text == p.skill_text.strip()
        assert max_chars is None or len(p.skill_text) <= max_chars
        assert legal[OPS.index(p.op)]
    if p.op == "no_edit" or not p.ok and p.reason != "skill_too_long":
        assert p.skill_text == ""
    if p.has_chinese:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in p.skill_text) or p.reason == "empty_skill"


# "\u0130" (I with dot) lowercases to two characters: offsets into a lowercased copy drift by one.
SKILL = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(["\u0130", "\u0130\u0130\u0130", "</skill>", "<SKILL>", "K"])),
                 min_size=1, max_size=6).map("".join).filter(
    lambda s: s.strip() and "</action>" not in s and not s.strip().lower().startswith("<skill>"))


@FUZZ
@given(op=st.sampled_from(OP_TOKENS), skill=SKILL, wrap=st.booleans(), pad=st.sampled_from(["", " ", "\n", "\n\n "]))
def test_well_formed_proposals_round_trip(fuzz_cases, op, skill, wrap, pad):
    fuzz_cases(CLASS)
    body = f"<skill>{skill}</skill>" if wrap else skill
    p = parse_proposal(f"{pad}{op}{pad}</action>{pad}{body}{pad}", legal=(True, True, True))
    assert p.op == OPS[OP_TOKENS.index(op)]
    if op == "NO_SKILL":
        assert p.ok and p.skill_text == ""
        return
    expected = skill.strip()  # the wrapper goes, up to its own (the last) closing tag
    if expected:
        assert p.ok and p.skill_text == expected
    else:
        assert p.reason == "empty_skill"


@dataclass(frozen=True)
class _Turn:
    observation: str
    env_action: str
    action_valid: bool
    next_observation: str


TURNS = st.lists(st.builds(_Turn, st.text(max_size=60), st.text(max_size=30), st.booleans(),
                           st.text(max_size=60)), max_size=8)


@FUZZ
@given(turns=TURNS, won=st.booleans(), max_chars=st.integers(1, 400))
def test_rendered_trajectory_fits_its_budget(fuzz_cases, turns, won, max_chars):
    fuzz_cases(CLASS)
    text = render_trajectory(turns, won=won, max_chars=max_chars)
    assert len(text) <= max_chars
