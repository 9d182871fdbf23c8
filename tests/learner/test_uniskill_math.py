"""UniSkill's pure math (learner/uniskill.py, learner/payload.py) against docs/algorithms.md S7:
REINFORCE++ / proposer, support regulariser and R_align cases with the spec's exact numbers."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import LearnerConfig, ProposerLossConfig
from learner.payload import payload_char_span, payload_mask
from learner.types import AlignRequest, ProposalRow
from learner.uniskill import (
    align_from_step_means,
    composite_reward,
    legal_op_probs,
    proposer_pg_loss,
    r_skill,
    step_payload_means,
    support_regularizer,
    trajectory_logprob,
    whiten_rewards,
)

ETA = 0.05

# ---------------------------------------------------------------------------------------------
# REINFORCE++ / proposer (S7 1-4)


def test_whitening_pair_single_and_constant():  # S7 proposer 1
    a = whiten_rewards(torch.tensor([0.1, -0.1]))
    torch.testing.assert_close(a, torch.tensor([0.70711, -0.70711]), atol=1e-5, rtol=0)
    assert whiten_rewards(torch.tensor([0.3])).tolist() == [0.0]
    assert whiten_rewards(torch.tensor([0.05, 0.05, 0.05])).tolist() == [0.0, 0.0, 0.0]


def test_whitening_ignores_padding_rows():  # S7 proposer 2
    base = whiten_rewards(torch.tensor([0.1, -0.1, 0.05]))
    padded = whiten_rewards(
        torch.tensor([0.1, 99.0, -0.1, 0.05, -7.0]), torch.tensor([True, False, True, True, False])
    )
    torch.testing.assert_close(padded[[0, 2, 3]], base)
    assert padded[1] == 0 and padded[4] == 0
    # one valid row among padding: no baseline -> 0
    assert whiten_rewards(torch.tensor([0.1, 5.0]), torch.tensor([True, False])).tolist() == [0.0, 0.0]


def test_composite_reward_per_op():  # S7 proposer 3
    assert composite_reward("no_edit", r_fmt=ETA, r_op=ETA, r_skill=-ETA) == (pytest.approx(0.1), "")
    assert composite_reward("add", r_fmt=ETA, r_op=-ETA, r_skill=0.03) == (pytest.approx(0.03), "")
    assert composite_reward("update", r_fmt=ETA, r_op=ETA, r_skill=ETA)[0] == pytest.approx(0.15)
    assert composite_reward(None, r_fmt=-ETA, r_op=None, r_skill=None) == (-0.05, "parse failure")
    assert composite_reward(None, r_fmt=-ETA, r_op=ETA, r_skill=ETA)[0] == -0.05
    # missing required components drop the row
    assert composite_reward("no_edit", r_fmt=ETA, r_op=None, r_skill=None)[0] is None
    assert composite_reward("add", r_fmt=ETA, r_op=ETA, r_skill=None)[0] is None
    # warm-up: r_fmt only
    assert composite_reward("add", r_fmt=ETA, r_op=None, r_skill=None, warmup=True) == (ETA, "warm-up")
    with pytest.raises(ValueError, match="unknown proposal op"):
        composite_reward("delete", r_fmt=ETA, r_op=ETA, r_skill=0.0)


def test_r_skill_channel():
    kw = {"eta": ETA}
    assert r_skill(content_supported=True, has_chinese=False, r_align=0.1833, **kw) == (ETA, "")
    assert r_skill(content_supported=True, has_chinese=False, r_align=-0.01, **kw) == (-0.01, "")
    assert r_skill(content_supported=False, has_chinese=False, r_align=0.2, **kw) == (-ETA, "")
    assert r_skill(content_supported=True, has_chinese=True, r_align=0.2, **kw)[0] == -ETA
    assert r_skill(content_supported=True, has_chinese=False, r_align=None, **kw) == (None, "no R_align")
    assert r_skill(content_supported=None, has_chinese=False, r_align=0.2, **kw)[0] is None
    # ablation "no R_align": the critic alone
    assert r_skill(content_supported=True, has_chinese=False, r_align=None, use_r_align=False, **kw)[0] == ETA
    assert (
        r_skill(content_supported=False, has_chinese=False, r_align=None, use_r_align=False, **kw)[0] == -ETA
    )


def test_advantage_covers_exactly_the_generated_tokens():  # S7 proposer 4
    # two proposals: lengths 3 and 2 (EOS = last token, included); the prefilled "<action>" is
    # prompt, so no column for it exists in the response tensors at all.
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([0.70711, -0.70711])
    loss, _ = proposer_pg_loss(
        logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0, num_proposals=2
    )
    loss.backward()
    # rho = 1: L = -mean_j(A_j) (seq-mean-token-mean); grad = -A_j / (n_tokens_j * proposals)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    expected = torch.tensor([[-0.70711 / 6] * 3, [0.70711 / 4, 0.70711 / 4, 0.0]])
    torch.testing.assert_close(logp.grad, expected, atol=1e-6, rtol=0)
    assert (logp.grad[mask == 0] == 0).all()


def test_seq_mean_token_mean_is_split_invariant():
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0] * 4, [1.0, 1.0, 0.0, 0.0], [1.0] * 3 + [0.0]])
    logp = torch.randn(3, 4, generator=gen) * 0.1
    old = torch.randn(3, 4, generator=gen) * 0.1
    adv = torch.tensor([1.0, -0.5, -0.5])
    kw = {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0, "num_proposals": 3}
    full, _ = proposer_pg_loss(logp, old, adv, mask, **kw)
    parts = sum(
        proposer_pg_loss(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], **kw)[0]
        for i in range(3)
    )
    assert full.item() == pytest.approx(parts.item(), abs=1e-7)


# ---------------------------------------------------------------------------------------------
# support regulariser (S7 1-6)

ALL = torch.tensor([[True, True, True]])


def test_uniform_legal_ops_give_zero():  # S7 support 1
    assert support_regularizer(torch.zeros(1, 3), ALL).item() == 0.0
    no_update = torch.tensor([[True, True, False]])
    assert support_regularizer(torch.tensor([[1.0, 1.0, 9.0]]), no_update).item() == 0.0


def test_worked_example_all_legal():  # S7 support 2
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    probs = legal_op_probs(logits, ALL)
    torch.testing.assert_close(probs, torch.tensor([[0.9867, 0.00665, 0.00665]]), atol=5e-5, rtol=0)
    violations = torch.relu(math.log(0.1) - probs.log())
    torch.testing.assert_close(violations, torch.tensor([[0.0, 2.7108, 2.7108]]), atol=1e-4, rtol=0)
    assert support_regularizer(logits, ALL, p_min=0.1).item() == pytest.approx(4.8990, abs=1e-4)


def test_worked_example_update_illegal():  # S7 support 3
    logits = torch.tensor([[5.0, 0.0, 0.0]], requires_grad=True)
    legal = torch.tensor([[True, True, False]])
    assert legal_op_probs(logits, legal)[0, 2].item() == 0.0
    loss = support_regularizer(logits, legal, p_min=0.1)
    assert loss.item() == pytest.approx(3.6562, abs=1e-4)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2] == 0.0


def test_gradient_raises_the_starved_ops():  # S7 support 4
    logits = torch.tensor([[5.0, 0.0, 1.0]], requires_grad=True)
    support_regularizer(logits, ALL).backward()
    g = logits.grad[0]
    assert g[1] < 0 and g[2] < 0 and g[0] > 0  # descent raises the starved ops, lowers the dominant one
    before = legal_op_probs(logits.detach(), ALL)[0]
    after = legal_op_probs(logits.detach() - 0.1 * g, ALL)[0]
    assert after[1] > before[1] and after[2] > before[2]


def test_invalid_support_settings_raise():  # S7 support 5
    with pytest.raises(ValueError, match="at least 2 legal"):
        support_regularizer(torch.zeros(1, 3), torch.tensor([[True, False, False]]))
    with pytest.raises(ValueError, match="p_min"):
        support_regularizer(torch.zeros(1, 3), ALL, p_min=1 / 3)
    with pytest.raises(ValueError, match="3 \\* p_min < 1"):
        ProposerLossConfig(p_min=0.34)
    with pytest.raises(ValueError, match="p_min"):
        ProposerLossConfig(p_min=0.0)


def test_decision_position_is_the_logit_row_predicting_the_op_token(tiny_model_dir):  # S7 support 6
    from transformers import AutoModelForCausalLM

    from learner.batch import collate_rows
    from learner.logprobs import response_logits, response_logprobs_and_op_logits
    from learner.types import TrainRow

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt, response = (5, 6, 7, 8), (11, 12, 13, 2)  # op token 12 at response position 1
    batch = collate_rows(
        [
            TrainRow(prompt_ids=prompt, response_ids=response, sampler_logprobs=(0.0,) * 4, group_id="g",
                     traj_id="t", step_idx=0, episode_score=0.0, action_valid=True)
        ],
        pad_token_id=0,
    )  # fmt: skip
    op_ids = torch.tensor([[12, 40, 41]])
    with torch.no_grad():
        logp, op_logits = response_logprobs_and_op_logits(
            model, batch, temperature=0.7, positions=torch.tensor([1]), op_token_ids=op_ids
        )
        # reference: the full-sequence forward; the logits at input index len(prompt) + 1 - 1 = 4
        # (the token BEFORE the op token) predict it
        full = model(input_ids=batch.input_ids).logits[0].float() / 0.7
    torch.testing.assert_close(op_logits[0], full[len(prompt) + 1 - 1, op_ids[0]], atol=1e-5, rtol=0)
    assert not torch.allclose(op_logits[0], full[len(prompt) + 1, op_ids[0]], atol=1e-3)
    # consistency with the response log-prob of the op token
    assert logp[0, 1].item() == pytest.approx(torch.log_softmax(full[4], -1)[12].item(), abs=1e-5)
    resp = response_logits(model, batch, temperature=0.7)
    torch.testing.assert_close(op_logits[0], resp[0, 1, op_ids[0]], atol=1e-5, rtol=0)
    # no decision position -> zeros
    _, none = response_logprobs_and_op_logits(
        model, batch, temperature=0.7, positions=torch.tensor([-1]), op_token_ids=op_ids
    )
    assert (none == 0).all()


# ---------------------------------------------------------------------------------------------
# R_align (S7 1-6)


def _steps(values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, L) log-probs and payload mask from per-step payload values (right-padded)."""
    width = max(len(v) for v in values)
    logp, mask = torch.zeros(len(values), width), torch.zeros(len(values), width)
    for i, v in enumerate(values):
        logp[i, : len(v)] = torch.tensor(v)
        mask[i, : len(v)] = 1.0
    return logp, mask


def _align(plus_o, plus_s, minus_o, minus_s, *, plus_turns=None, minus_turns=None):
    return align_from_step_means(
        torch.tensor(plus_o), torch.tensor(plus_s), torch.tensor(minus_o), torch.tensor(minus_s),
        plus_turns=plus_turns or len(plus_o), minus_turns=minus_turns or len(minus_o),
    )  # fmt: skip


def test_same_skill_gives_zero():  # S7 R_align 1 (the worker test checks the inference path)
    out = _align([-0.5, -0.2], [-0.5, -0.2], [-0.4, -0.6, -0.2], [-0.4, -0.6, -0.2])
    assert out.delta_plus == 0 and out.delta_minus == 0 and out.r_align == 0


def test_constant_shift_leaves_r_align_unchanged():  # S7 R_align 2
    base = _align([-0.5, -0.2], [-0.3, -0.1], [-0.4, -0.6, -0.2], [-0.45, -0.6, -0.25])
    c = -1.7
    shifted = _align(
        [-0.5 + c, -0.2 + c],
        [-0.3 + c, -0.1 + c],
        [-0.4 + c, -0.6 + c, -0.2 + c],
        [-0.45 + c, -0.6 + c, -0.25 + c],
    )
    assert shifted.r_align == pytest.approx(base.r_align, abs=1e-6)


def test_worked_example():  # S7 R_align 3
    out = _align([-0.5, -0.2], [-0.3, -0.1], [-0.4, -0.6, -0.2], [-0.45, -0.6, -0.25])
    assert out.delta_plus == pytest.approx(0.15, abs=1e-6)
    assert out.delta_minus == pytest.approx(-0.0333, abs=1e-4)
    assert out.r_align == pytest.approx(0.1833, abs=1e-4)
    assert r_skill(content_supported=True, has_chinese=False, r_align=out.r_align, eta=ETA)[0] == 0.05


def test_think_tokens_excluded():  # S7 R_align 4
    # step: [think tokens..., payload tokens...]; only the payload flags count
    logp = torch.tensor([[-3.0, -2.0, -0.5, -0.7], [-1.0, -0.1, -0.3, 0.0]])
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    j = trajectory_logprob(logp, mask)
    changed = logp.clone()
    changed[0, :2] = torch.tensor([-9.0, -0.01])
    changed[1, 0] = -5.0
    assert trajectory_logprob(changed, mask) == j
    assert j == pytest.approx(((-0.6) + (-0.2)) / 2)


def test_mean_of_step_means_not_pooled():  # S7 R_align 5
    logp, mask = _steps([[-1.0], [-0.1, -0.1, -0.1, -0.1]])
    j = trajectory_logprob(logp, mask)
    pooled = float((logp * mask).sum() / mask.sum())
    assert j == pytest.approx(-0.55)
    assert pooled == pytest.approx(-0.28) and abs(j - pooled) > 0.2
    means, scorable = step_payload_means(*_steps([[-1.0], [-0.2, -0.4]]))
    torch.testing.assert_close(means, torch.tensor([-1.0, -0.3]))
    assert scorable.all()
    assert trajectory_logprob(torch.zeros(2, 3), torch.zeros(2, 3)) is None


def test_low_coverage_masks_r_skill():  # S7 R_align 6
    # 3 scorable of 5 turns on the success anchor: coverage 0.6 < 0.8
    out = _align([-0.5, -0.2, -0.1], [-0.3, -0.1, 0.0], [-0.4], [-0.45], plus_turns=5)
    assert out.r_align is None and out.delta_plus is None
    assert out.coverage_plus == pytest.approx(0.6) and out.coverage_minus == 1.0
    assert out.reason == "plus coverage 0.6 < 0.8"
    skill, _ = r_skill(content_supported=True, has_chinese=False, r_align=out.r_align, eta=ETA)
    assert skill is None  # -> an ADD/UPDATE row is dropped and never write-eligible
    assert composite_reward("add", r_fmt=ETA, r_op=ETA, r_skill=skill)[0] is None
    # exactly 0.8 passes
    ok = _align([-0.5] * 4, [-0.4] * 4, [-0.4], [-0.45], plus_turns=5)
    assert ok.r_align == pytest.approx(0.15)
    # no scorable step at all
    assert _align([], [], [-0.4], [-0.4], plus_turns=2).r_align is None


# ---------------------------------------------------------------------------------------------
# payload mask (the chosen approach: derived from the tokenizer when the row has none)


def _char_decode(vocab: dict[int, str]):
    return lambda ids: "".join(vocab[i] for i in ids)


def test_payload_span():
    assert payload_char_span("<think>x</think><action> go to desk 1 </action>") == (25, 37)
    assert payload_char_span("<ACTION>Open Drawer</Action>") == (8, 19)
    assert payload_char_span("no tags") is None
    assert payload_char_span("<action>  </action>") is None
    assert payload_char_span("</action><action>x") is None


def test_payload_mask_excludes_think_and_tags():
    vocab = {1: "<think>", 2: "pick", 3: " up", 4: "</think>", 5: "<action>", 6: "go", 7: " to",
             8: " desk", 9: "</action>", 10: "<eos>", 11: ">go", 12: "<action"}  # fmt: skip
    decode = _char_decode(vocab)
    assert payload_mask([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], decode) == (False,) * 5 + (True,) * 3 + (False,) * 2
    # constrained decoding without think: "<action>X</action>" + EOS
    assert payload_mask([5, 6, 8, 9, 10], decode) == (False, True, True, False, False)
    # a token straddling the open tag overlaps the payload
    assert payload_mask([12, 11, 7, 9], decode) == (False, True, True, False)
    # no closing tag: not scorable
    assert payload_mask([5, 6, 7, 10], decode) == (False,) * 4


def test_payload_mask_with_a_real_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<think>the mug is on the countertop</think><action>go to countertop 1</action>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decode = lambda x: tok.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    flags = payload_mask(ids, decode)
    picked = decode([i for i, f in zip(ids, flags) if f])
    assert "go to countertop 1" in picked and "think" not in picked and "mug" not in picked
    assert len(picked) < len("go to countertop 1") + 12  # at most the tag fragments sharing a token


# ---------------------------------------------------------------------------------------------
# contracts and config


def test_contract_validation():
    kw = {"candidate_id": "c", "prompt_ids": (1, 2), "response_ids": (3, 4), "op_position": 0,
          "op_token_ids": (7, 8, 9), "legal_ops": (True, True, False), "op": "add", "r_fmt": ETA}  # fmt: skip
    ProposalRow(**kw)
    with pytest.raises(ValueError, match="op_position 2 outside"):
        ProposalRow(**{**kw, "op_position": 2})
    with pytest.raises(ValueError, match="distinct"):
        ProposalRow(**{**kw, "op_token_ids": (7, 7, 9)})
    with pytest.raises(ValueError, match="sampler_logprobs"):
        ProposalRow(**{**kw, "sampler_logprobs": (0.0,)})
    with pytest.raises(ValueError, match="plus_turns"):
        AlignRequest(candidate_id="c", plus=(), minus=(), plus_turns=0, minus_turns=1)


def test_config_defaults_and_errors():
    cfg = LearnerConfig()
    p = cfg.proposer
    assert not p.enabled and p.lambda_prop == 0.5 and p.eta == 0.05 and p.p_min == 0.1 and p.c_sup == 0.01
    assert p.beta_kl == 0.02 and p.kl_type == "k3" and p.coverage_min == 0.8
    assert p.support_regularizer and p.use_r_align and p.composite
    with pytest.raises(ValueError, match="proposer.composite=false"):
        ProposerLossConfig(composite=False)
    with pytest.raises(ValueError, match="coverage_min"):
        ProposerLossConfig(coverage_min=1.5)
    with pytest.raises(ValueError, match="lamda_prop"):
        LearnerConfig(proposer={"lamda_prop": 0.5})


def test_forced_payload_tokens_leave_the_means():  # S4: tokens the constraint forced (hand-computed)
    """Payload tokens with a single allowed id have log-prob 0 under s_orig and s~ alike. Kept in
    the payload mean they shrink every Delta; R_align excludes them, and a turn made only of them
    counts for coverage but not in J.

    tau+ has 3 turns: A payload (-1, -2, forced, forced) -> s~ (-0.5, -1.5, 0, 0); B wholly forced;
    C (-0.4) -> (-0.2). tau- has 2 turns: (-1) -> (-1.2); (-0.6, forced) -> (-0.8, 0).
    Excluded: J+ = mean(-1.5, -0.4) = -0.95 -> mean(-1.0, -0.2) = -0.6, Delta+ = 0.35;
    J- = mean(-1, -0.6) = -0.8 -> mean(-1.2, -0.8) = -1.0, Delta- = -0.2; R_align = 0.55.
    Kept (the old rule): Delta+ = mean(-0.5, 0, -0.2) - mean(-0.75, 0, -0.4) = 0.15,
    Delta- = mean(-1.2, -0.4) - mean(-1, -0.3) = -0.15, R_align = 0.30."""
    from learner.payload import free_payload_mask

    one, many = (7,), (7, 8)
    assert free_payload_mask([0, 1, 1, 1, 1, 0], [many, many, many, one, one, one]) == [
        False, True, True, False, False, False]
    assert free_payload_mask([1, 0], None) == [True, False]
    with pytest.raises(ValueError, match="allowed-id entries"):
        free_payload_mask([1, 1], [many])

    def means(values, forced):
        logp, payload = _steps(values)
        free = torch.tensor([[0.0 if f else m for f, m in zip(fs + [False] * 9, row)]
                             for fs, row in zip(forced, payload.tolist())])
        return step_payload_means(logp, free)[0]

    plus_o = means([[-1, -2, 0, 0], [-0.4]], [[False, False, True, True], [False]])
    plus_s = means([[-0.5, -1.5, 0, 0], [-0.2]], [[False, False, True, True], [False]])
    minus_o = means([[-1], [-0.6, 0]], [[False], [False, True]])
    minus_s = means([[-1.2], [-0.8, 0]], [[False], [False, True]])
    out = align_from_step_means(plus_o, plus_s, minus_o, minus_s, plus_turns=3, minus_turns=2, plus_forced=1)
    assert (out.coverage_plus, out.coverage_minus) == (1.0, 1.0)
    assert out.delta_plus == pytest.approx(0.35) and out.delta_minus == pytest.approx(-0.2)
    assert out.r_align == pytest.approx(0.55)
    kept = _align([-0.75, 0.0, -0.4], [-0.5, 0.0, -0.2], [-1.0, -0.3], [-1.2, -0.4])
    assert kept.r_align == pytest.approx(0.30) and kept.delta_plus == pytest.approx(0.15)
    only_forced = align_from_step_means(torch.zeros(0), torch.zeros(0), minus_o, minus_s, plus_turns=2,
                                        minus_turns=2, plus_forced=2)
    assert only_forced.r_align is None and only_forced.reason == "plus: every payload token was forced"
