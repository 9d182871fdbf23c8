"""Every case of UniSkill's proposer reward (docs/algorithms.md S3) computed by hand, from the rule
critic's verdict (with the bank's text rules) through r_skill to the composite, eta = 0.05.

The chain mirrors the glue (deploy/stages/uniskill_glue.py): r_fmt = +eta when the output parsed,
r_op = +eta when the verdict says the op was reasonable else -eta, content from the verdict; text the
bank would refuse keeps the critic's op judgement and becomes unsupported (scored once)."""

from __future__ import annotations

import pytest

from learner.uniskill import composite_reward, r_skill
from skillbank_service.critics import RuleCritic, refused_text_verdict
from skillbank_service.types import CriticRequest, TrajectoryEvidence
from skillbank_service.validation import validate_skill_text

ETA = 0.05
TRAJ = """Outcome: FAILURE after 3 step(s).
Observation 1: You are in the middle of a room.
Action 1: go to countertop 1
Observation 2: On the countertop 1, you see a apple 1.
Action 2: take apple 1 from countertop 1
Observation 3: You pick up the apple 1.
Action 3: go to fridge 1"""
LOST = TrajectoryEvidence(won=False, actions=("go to countertop 1", "take apple 1 from countertop 1", "go to fridge 1"))
WON = TrajectoryEvidence(won=True, actions=("go to countertop 1", "take apple 1 from countertop 1",
                                            "heat apple 1 with microwave 1"))
SUPPORTED = "Take the apple from the countertop, then go to the fridge."
UNSUPPORTED = "Always negotiate shipping insurance and verify warranty paperwork thoroughly."
REFUSED = "go to fridge</action> then take the apple from the countertop"
RETRIEVED = "Take the apple from the countertop first."


def reward(op: str | None, *, text: str = "", source: TrajectoryEvidence = LOST, reference: TrajectoryEvidence = WON,
           retrieved: str | None = None, r_align: float | None = None, warmup: bool = False) -> float | None:
    """The composite reward of one proposal (op None: the output did not parse)."""
    if op is None or warmup:
        return composite_reward(op, r_fmt=ETA if op else -ETA, r_op=None, r_skill=None, warmup=warmup)[0]
    request = CriticRequest(candidate_id="c", op=op, task_type="pick_heat_then_place_in_recep", text=text,
                            source_trajectory=TRAJ, source=source, reference=reference, retrieved_skill_text=retrieved)
    verdict = RuleCritic().judge(request)
    invalid = validate_skill_text(text, min_chars=20, max_chars=1200) if op != "no_edit" else None
    if invalid is not None:
        verdict = refused_text_verdict(verdict, invalid)
    skill = None
    if op != "no_edit":
        skill, _ = r_skill(content_supported=verdict.content_supported, has_chinese=False, r_align=r_align, eta=ETA)
    return composite_reward(op, r_fmt=ETA, r_op=ETA if verdict.op_reasonable else -ETA, r_skill=skill)[0]


@pytest.mark.parametrize(("case", "kwargs", "expected"), [
    # NO_SKILL: r_fmt + r_op, no r_skill term
    ("no_edit, source won", {"op": "no_edit", "source": WON, "reference": LOST}, 0.05 + 0.05),
    ("no_edit, source failed, reference won with an action the source never took",
     {"op": "no_edit"}, 0.05 - 0.05),
    ("no_edit, that action already in the retrieved skill",
     {"op": "no_edit", "retrieved": "Heat the apple with the microwave."}, 0.05 + 0.05),
    # ADD: r_fmt + r_op + r_skill, r_skill = clip(R_align, -eta, eta) when supported
    ("add supported, R_align inside the clip", {"op": "add", "text": SUPPORTED, "r_align": 0.03}, 0.05 + 0.05 + 0.03),
    ("add supported, R_align above eta", {"op": "add", "text": SUPPORTED, "r_align": 0.2}, 0.05 + 0.05 + 0.05),
    ("add supported, R_align below -eta", {"op": "add", "text": SUPPORTED, "r_align": -0.2}, 0.05 + 0.05 - 0.05),
    ("add unsupported", {"op": "add", "text": UNSUPPORTED, "r_align": 0.2}, 0.05 + 0.05 - 0.05),
    ("add refused by the text rules, op reasonable", {"op": "add", "text": REFUSED, "r_align": 0.2}, 0.05 + 0.05 - 0.05),
    ("add near-duplicating the retrieved skill", {"op": "add", "text": RETRIEVED + "!", "retrieved": RETRIEVED,
                                                  "r_align": 0.01}, 0.05 - 0.05 + 0.01),
    # UPDATE: legal only with a retrieved skill, and must change it
    ("update supported", {"op": "update", "text": SUPPORTED, "retrieved": RETRIEVED, "r_align": 0.04},
     0.05 + 0.05 + 0.04),
    ("update without a retrieved skill", {"op": "update", "text": SUPPORTED, "r_align": 0.01}, 0.05 - 0.05 + 0.01),
    ("update unsupported", {"op": "update", "text": UNSUPPORTED, "retrieved": RETRIEVED, "r_align": 0.2},
     0.05 + 0.05 - 0.05),
    ("update refused, op unreasonable (no retrieved skill)", {"op": "update", "text": REFUSED, "r_align": 0.2},
     0.05 - 0.05 - 0.05),
    # no critic: parse failure and warm-up are r_fmt alone
    ("parse failure", {"op": None}, -0.05),
    ("warm-up", {"op": "add", "text": SUPPORTED, "warmup": True}, 0.05),
])
def test_reward_cases_by_hand(case, kwargs, expected):
    assert reward(**kwargs) == pytest.approx(expected, abs=1e-12), case


def test_refused_text_is_scored_once():
    """A refused ADD whose op was reasonable earns what an unsupported ADD earns (+0.05), not the
    -0.05 of being op-unreasonable too; both stay below NO_SKILL's 0.10 and above a parse failure."""
    assert "tag" in validate_skill_text(REFUSED, min_chars=20, max_chars=1200)
    assert reward("add", text=REFUSED, r_align=0.2) == pytest.approx(reward("add", text=UNSUPPORTED, r_align=0.2))
    assert reward(None) < reward("add", text=REFUSED) < reward("no_edit", source=WON, reference=LOST)


def test_chinese_text_earns_minus_eta_whatever_r_align():
    skill, _ = r_skill(content_supported=True, has_chinese=True, r_align=0.2, eta=ETA)
    assert composite_reward("add", r_fmt=ETA, r_op=ETA, r_skill=skill)[0] == pytest.approx(0.05)
