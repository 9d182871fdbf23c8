"""UniSkill's proposer role (pure parts): parsing, trajectory/prompt rendering, op tokens, candidate
selection; plus RolloutWorker.generate_proposals on the tiny model (HF engine)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_workers.proposer import (
    OP_TOKENS,
    PREFILL,
    eligible,
    group_members,
    legal_ops,
    op_first_token_ids,
    parse_proposal,
    render_proposer_message,
    render_proposer_prompt_ids,
    render_trajectory,
    select_candidates,
    strip_think,
)
from rollout_workers.types import Candidate

SKILL = "Open every closed receptacle before searching it; objects are often inside."

# ---- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, op, skill",
    [
        ("NO_SKILL</action>", "no_edit", ""),
        ("NO_SKILL</action>\nanything after is ignored", "no_edit", ""),
        (f"ADD_NEW_SKILL</action>\n{SKILL}\n", "add", SKILL),
        (f" UPDATE_SKILL </action><skill>\n{SKILL}\n</skill>", "update", SKILL),
    ],
)
def test_parse_valid(text, op, skill):
    p = parse_proposal(text)
    assert (p.op, p.skill_text, p.ok, p.reason, p.has_chinese) == (op, skill, True, None, False)


@pytest.mark.parametrize(
    "text, legal, reason",
    [
        ("ADD_NEW_SKILL and then some text", (True, True, True), "missing_action_tags"),
        ("add_new_skill</action> lower case is not the token", (True, True, True), "unknown_op"),
        ("DELETE_SKILL</action> x", (True, True, True), "unknown_op"),
        (f"UPDATE_SKILL</action>{SKILL}", (True, True, False), "illegal_update"),
        ("ADD_NEW_SKILL</action>   \n ", (True, True, True), "empty_skill"),
        ("ADD_NEW_SKILL</action><skill></skill>", (True, True, True), "empty_skill"),
        ("ADD_NEW_SKILL</action>" + "x" * 50, (True, True, True), "skill_too_long"),
    ],
)
def test_parse_failures_name_the_reason(text, legal, reason):
    p = parse_proposal(text, legal=legal, max_skill_chars=40)
    assert not p.ok and p.reason == reason


def test_parse_not_prefilled_and_chinese():
    p = parse_proposal(f"<action>ADD_NEW_SKILL</action> {SKILL}", prefilled=False)
    assert p.ok and p.op == "add" and p.skill_text == SKILL
    assert parse_proposal("ADD_NEW_SKILL</action>", prefilled=False).reason == "missing_action_tags"
    zh = parse_proposal("ADD_NEW_SKILL</action> 先打开柜子 then search")
    assert zh.ok and zh.has_chinese  # parses (r_fmt +eta) but r_skill is penalised downstream


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.tuples(st.booleans(), st.booleans(), st.booleans()), st.booleans())
def test_parse_never_raises_and_is_consistent(text, legal, prefilled):
    p = parse_proposal(text, legal=legal, prefilled=prefilled, max_skill_chars=100)
    assert (p.reason is None) == p.ok
    if p.ok:
        assert p.op is not None and legal[("no_edit", "add", "update").index(p.op)]
        assert (p.op == "no_edit") == (p.skill_text == "")


def test_legal_ops():
    assert legal_ops(False) == (True, True, False) and legal_ops(True) == (True, True, True)


# ---- rendering -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class T:
    observation: str
    env_action: str
    action_valid: bool = True
    next_observation: str = "Nothing happens."


def _turns(n: int) -> list[T]:
    return [T(f"obs {k} " + "z" * 40, f"go to cabinet {k}") for k in range(1, n + 1)]


def test_render_trajectory_full_and_budgeted():
    turns = _turns(3) + [T("obs 4", "<think>hmm</think>xyz", action_valid=False, next_observation="You won!")]
    full = render_trajectory(turns, won=True, max_chars=10_000)
    assert full.startswith("Outcome: SUCCESS after 4 step(s).")
    assert "Action 1: go to cabinet 1" in full and full.endswith("Final observation: You won!")
    assert "Action 4: xyz (invalid)" in full and "hmm" not in full
    short = render_trajectory(turns, won=False, max_chars=200)
    assert len(short) <= 200 and "earlier step(s) omitted" in short and "Action 4" in short
    assert "Action 1:" not in short and short.startswith("Outcome: FAILURE")
    tiny = render_trajectory(turns, won=False, max_chars=30)
    assert len(tiny) <= 30 and tiny.endswith("...")
    with pytest.raises(ValueError, match="max_chars"):
        render_trajectory(turns, won=True, max_chars=0)


def test_strip_think():
    assert strip_think("<think>a\nb</think> go") == "go"
    assert strip_think("x <think>never closed") == "x"


def _message(skill_text, legal):
    return render_proposer_message(
        setting="a household task",
        task="put a clean mug in cabinet.",
        source="SOURCE-TRAJ",
        source_won=True,
        reference="REFERENCE-TRAJ",
        skill_text=skill_text,
        legal=legal,
    )


def test_proposer_message_content():
    with_skill = _message("Skill text </skill> with a tag", legal_ops(True))
    assert "SOURCE-TRAJ" in with_skill and "REFERENCE-TRAJ" in with_skill
    assert with_skill.index("SOURCE-TRAJ") < with_skill.index("REFERENCE-TRAJ")
    assert "it failed" in with_skill  # the reference has the opposite outcome
    assert "<skill>\nSkill text [/skill] with a tag\n</skill>" in with_skill
    assert all(tok in with_skill for tok in OP_TOKENS)
    without = _message(None, legal_ops(False))
    assert "No skill was retrieved" in without and "UPDATE_SKILL" not in without
    assert "<action>" in without  # the output format is stated


def test_prompt_ids_end_with_prefill_and_op_tokens(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = render_proposer_prompt_ids(tok, _message(SKILL, legal_ops(True)))
    assert tok.decode(ids).endswith("assistant\n" + PREFILL)
    first = op_first_token_ids(tok)
    assert len(set(first)) == 3
    prefix = tok.encode(PREFILL, add_special_tokens=False)
    for tid, op in zip(first, OP_TOKENS):
        assert tok.encode(PREFILL + op, add_special_tokens=False)[len(prefix)] == tid


# ---- candidate selection --------------------------------------------------------------------------


@dataclass(frozen=True)
class M:
    traj_id: str
    group_id: str
    task_id: str
    won: bool


def _group(gid: str, outcomes: str) -> list[M]:
    return [M(f"{gid}/{k}", gid, f"task-{gid}", o == "S") for k, o in enumerate(outcomes)]


def test_candidates_need_two_of_each_outcome():
    assert not eligible(_group("a", "SFFF")) and not eligible(_group("b", "SSSF")) and eligible(_group("c", "SSFF"))
    groups = [_group("a", "SFFF"), _group("b", "SSFF"), _group("c", "SSSSSSSS")]
    cands = select_candidates(groups, random.Random(0))
    assert [c.source_id for c in cands] == [m.traj_id for m in groups[1]]


def test_candidate_roles():
    group = _group("g", "SSFFSF")
    won = {m.traj_id: m.won for m in group}
    cands = select_candidates([group], random.Random(3))
    assert len(cands) == 6
    for c in cands:
        assert isinstance(c, Candidate) and c.task_id == "task-g" and c.group_id == "g"
        assert len({c.source_id, c.reference_id, c.plus_id, c.minus_id}) == 4
        assert won[c.reference_id] != won[c.source_id] == c.source_won
        assert won[c.plus_id] and not won[c.minus_id]


def test_selection_is_deterministic_and_capped():
    groups = [_group("a", "SSFF"), _group("b", "SFSFSF")]
    one = select_candidates(groups, random.Random(7), max_candidates=3)
    assert one == select_candidates(groups, random.Random(7), max_candidates=3) and len(one) == 3
    ids = [c.source_id for c in select_candidates(groups, random.Random(7))]
    assert [ids.index(c.source_id) for c in one] == sorted(ids.index(c.source_id) for c in one)


def test_selection_rejects_bad_groups():
    with pytest.raises(ValueError, match="mixes tasks"):
        select_candidates([[M("1", "g", "t1", True), M("2", "g", "t2", False)]], random.Random(0))
    with pytest.raises(ValueError, match="repeats"):
        select_candidates([[M("1", "g", "t", True), M("1", "g", "t", False)]], random.Random(0))


def test_group_members_keeps_order():
    ms = [M("1", "b", "t", True), M("2", "a", "t", True), M("3", "b", "t", False)]
    assert [[m.traj_id for m in g] for g in group_members(ms)] == [["1", "3"], ["2"]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=10), max_size=6), st.integers(0, 2**31))
def test_selection_properties(outcomes, seed):
    groups = [[M(f"{g}/{k}", str(g), f"t{g}", w) for k, w in enumerate(o)] for g, o in enumerate(outcomes)]
    won = {m.traj_id: m.won for grp in groups for m in grp}
    cands = select_candidates(groups, random.Random(seed))
    expected = sum(len(o) for o in outcomes if sum(o) >= 2 and len(o) - sum(o) >= 2)
    assert len(cands) == expected
    for c in cands:
        assert won[c.plus_id] and not won[c.minus_id] and won[c.reference_id] != won[c.source_id]
        assert {i.split("/")[0] for i in (c.source_id, c.reference_id, c.plus_id, c.minus_id)} == {c.group_id}


# ---- generation on the worker's engine --------------------------------------------------------------


def test_worker_generate_proposals(tiny_model_dir, hf_model, reference_logprobs):
    from transformers import AutoTokenizer

    from envs.config import EnvConfig
    from envs.pool import EnvPool
    from rollout_workers.config import EngineConfig, RolloutConfig
    from rollout_workers.worker import RolloutWorker

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = EngineConfig(engine="hf", device="cpu", max_model_len=2048)
    rollout = RolloutConfig(use_think=False, max_response_tokens=8, max_prompt_tokens=1024)
    worker = RolloutWorker(engine, rollout, str(tiny_model_dir), [EnvPool(EnvConfig(max_steps=2), 1)])
    prompts = [
        render_proposer_prompt_ids(tok, _message(SKILL, legal_ops(True))),
        render_proposer_prompt_ids(tok, _message(None, legal_ops(False))),
    ]
    gens = worker.generate_proposals(prompts, max_tokens=6, temperature=1.0, seed=5)
    assert len(gens) == 2 and all(1 <= len(g.token_ids) <= 6 and g.allowed_token_ids is None for g in gens)
    again = worker.generate_proposals(prompts, max_tokens=6, temperature=1.0, seed=5)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    for p, g in zip(prompts, gens):
        ref = reference_logprobs(hf_model, p, g.token_ids, 1.0)
        assert g.logprobs == pytest.approx(ref, abs=1e-4)
        parse_proposal(g.text)  # random tiny-model text: must not raise
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        worker.generate_proposals([[1] * 2047], max_tokens=6, temperature=1.0, seed=0)


def test_op_ids_with_a_qwen_style_pretokenizer():
    """Qwen2's pre-tokeniser glues one punctuation mark to the following letters (">NO"), so the op
    token's id inside "<action>NO_SKILL" is not what the model emits after a prompt ending in ">";
    the regulariser's ids are the op tokens' own first ids."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    qwen_split = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    corpus = [f"<action>{op}</action> {op}" for op in OP_TOKENS] * 50
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    ids = op_first_token_ids(fast)
    assert ids == tuple(fast.encode(op, add_special_tokens=False)[0] for op in OP_TOKENS)
    prefix = fast.encode(PREFILL, add_special_tokens=False)
    in_context = fast.encode(PREFILL + OP_TOKENS[0], add_special_tokens=False)
    assert in_context[: len(prefix)] != prefix  # the merge this guards against really happens


def test_worker_generate_proposals_with_constrained_op(tiny_model_dir, hf_model, reference_logprobs):
    """uniskill.proposer.constrain_op: the op comes from a constrained call over the legal
    "<OP></action>" strings, the skill text from an unconstrained continuation; every output
    parses, and the returned ids/logprobs are the engine's samples (the unconstrained tail's
    logprobs match teacher-forced scoring of prompt + op tokens)."""
    from transformers import AutoTokenizer

    from deploy.stages.uniskill_glue import op_choices
    from envs.config import EnvConfig
    from envs.pool import EnvPool
    from rollout_workers.config import EngineConfig, RolloutConfig
    from rollout_workers.worker import RolloutWorker

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = EngineConfig(engine="hf", device="cpu", max_model_len=2048)
    rollout = RolloutConfig(use_think=False, max_response_tokens=8, max_prompt_tokens=1024)
    worker = RolloutWorker(engine, rollout, str(tiny_model_dir), [EnvPool(EnvConfig(max_steps=2), 1)])
    legal = [legal_ops(True), legal_ops(False)] * 3
    prompts = [render_proposer_prompt_ids(tok, _message(SKILL if lg[2] else None, lg)) for lg in legal]
    gens = worker.generate_proposals(prompts, max_tokens=24, temperature=1.0, seed=3,
                                     op_choices=[op_choices(lg) for lg in legal])
    for p, lg, g in zip(prompts, legal, gens):
        parsed = parse_proposal(g.text, legal=lg)
        assert parsed.op is not None and parsed.reason != "unknown_op", g.text
        assert len(g.token_ids) == len(g.logprobs) <= 24
        if parsed.op != "no_edit":  # the continuation's logprobs are the unconstrained policy's
            head = next(n for n in range(1, len(g.token_ids) + 1) if tok.decode(g.token_ids[:n]).endswith("</action>"))
            tail_ref = reference_logprobs(hf_model, list(p) + list(g.token_ids[:head]), g.token_ids[head:], 1.0)
            assert g.logprobs[head:] == pytest.approx(tail_ref, abs=1e-4)
