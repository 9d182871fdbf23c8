"""The skill-edit op vocabulary is written in three packages that may not import each other's
internals: the learner (`OP_ORDER`, the order of `ProposalRow.op_token_ids` / `legal_ops`), the
skill bank (`EditOp`) and the proposer role (`OPS` / `OP_TOKENS`, what the model emits). They must
name the same ops, in the same order, with the same meaning."""

from __future__ import annotations

from typing import get_args

from learner.types import OP_ORDER, ProposalOp
from rollout_workers import proposer
from skillbank_service.types import EditOp

MEANING = {"no_edit": "NO_SKILL", "add": "ADD_NEW_SKILL", "update": "UPDATE_SKILL"}


def test_same_ops_in_the_same_order():
    assert OP_ORDER == ("no_edit", "add", "update")
    assert get_args(ProposalOp) == OP_ORDER
    assert get_args(EditOp) == OP_ORDER
    assert get_args(proposer.EditOp) == OP_ORDER
    assert proposer.OPS == OP_ORDER


def test_op_tokens_mean_the_ops_at_the_same_index():
    assert proposer.OP_TOKENS == tuple(MEANING[op] for op in OP_ORDER)
    for op, token in zip(OP_ORDER, proposer.OP_TOKENS):
        parsed = proposer.parse_proposal(f"{token}</action> look in the cabinet first")
        assert parsed.op == op and parsed.ok


def test_update_is_the_op_that_needs_a_retrieved_skill():
    # legal_ops is indexed like OP_ORDER: only "update" depends on a retrieved skill
    without = dict(zip(OP_ORDER, proposer.legal_ops(False)))
    assert without == {"no_edit": True, "add": True, "update": False}
    assert all(proposer.legal_ops(True))
