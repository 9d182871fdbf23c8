"""UniSkill in LearnerWorker (torch backend, tiny model): R_align from the batched no-grad pass
(S4, S7 R_align 1), the proposer rewards and gates (S3), whitening over all proposals, and the
joint actor + proposer optimiser step (one step per mini-batch, split-invariant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from learner.batch import collate_rows
from learner.config import DistillConfig, LearnerConfig
from learner.logprobs import response_logits
from learner.payload import payload_mask
from learner.types import AlignAnchor, AlignRequest, ProposalRow, TrainRow
from learner.uniskill import support_regularizer, whiten_rewards
from learner.worker import LearnerWorker

ETA = 0.05
SKILL = "look in the cabinet first"
SWAPPED = "clean the mug before you put it"


def cfg(**kw) -> LearnerConfig:
    prop = {"enabled": True, "beta_kl": 0.0, **kw.pop("proposer", {})}
    base = {"lr": 1e-3, "use_deepspeed": False, "kl_coef": 0.0, "micro_batch_rows": 4, "seed": 3, "eps": 1.0}
    return LearnerConfig(**{**base, **kw}, proposer=prop)


def params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.backend.module.named_parameters()}


def max_param_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def enc(tok, text: str) -> tuple[int, ...]:
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def prompt(tok, skill: str, k: int) -> tuple[int, ...]:
    return enc(
        tok, f"<|im_start|>user\nSkill: {skill}\nYou see a cabinet {k}.<|im_end|>\n<|im_start|>assistant\n"
    )


def anchor_rows(tok) -> list[TrainRow]:
    """Group g: success trajectory s (3 turns), failures f and h (2 turns each). Responses are
    think + action + EOS, so the payload is a strict subset of the response."""
    rows = []
    for traj, turns, score in (("s", 3, 10.0), ("f", 2, 0.0), ("h", 2, 0.0)):
        for k in range(turns):
            resp = enc(tok, f"<think>the mug {k}</think><action>go to countertop {k + 1}</action>") + (
                tok.eos_token_id,
            )
            rows.append(
                TrainRow(
                    prompt_ids=prompt(tok, SKILL, k), response_ids=resp, sampler_logprobs=(-1.0,) * len(resp),
                    group_id="g", traj_id=traj, step_idx=k, episode_score=score, action_valid=True,
                )
            )  # fmt: skip
    return rows


def op_ids(tok) -> tuple[int, int, int]:
    return tuple(enc(tok, name)[0] for name in ("NO_SKILL", "ADD_NEW_SKILL", "UPDATE_SKILL"))  # type: ignore[return-value]


def proposal(tok, cid: str, op: str | None, **kw) -> ProposalRow:
    text = {"no_edit": "NO_SKILL", "add": "ADD_NEW_SKILL", "update": "UPDATE_SKILL", None: "maybe"}[op]
    resp = enc(tok, f"{text}</action> {cid} clean the mug first") + (tok.eos_token_id,)
    base = {"candidate_id": cid, "prompt_ids": enc(tok, f"<|im_start|>user\npropose {cid}<|im_end|>\n<action>"),
            "response_ids": resp, "op_position": 0, "op_token_ids": op_ids(tok),
            "legal_ops": (True, True, op == "update"), "op": op, "r_fmt": ETA if op else -ETA,
            "r_op": ETA, "content_supported": True}  # fmt: skip
    return ProposalRow(**{**base, **kw})


def request(tok, rows, cid: str, skill: str = SWAPPED, *, plus_turns=3, minus_turns=2) -> AlignRequest:
    def anchors(traj: str):
        return tuple(
            AlignAnchor(row_index=i, swapped_prompt_ids=prompt(tok, skill, r.step_idx))
            for i, r in enumerate(rows)
            if r.traj_id == traj
        )

    return AlignRequest(
        candidate_id=cid,
        plus=anchors("s"),
        minus=anchors("f"),
        plus_turns=plus_turns,
        minus_turns=minus_turns,
    )


def test_same_skill_gives_zero_r_align(tiny_model_dir, tok):  # S7 R_align 1 through the worker
    rows = anchor_rows(tok)
    w = LearnerWorker(cfg(micro_batch_rows=2), str(tiny_model_dir))
    props = [proposal(tok, "a", "add"), proposal(tok, "b", "update")]
    align = [request(tok, rows, "a", SKILL), request(tok, rows, "b", SKILL)]
    m = w.train_step(rows, props, align)
    for s in m.proposal_scores:
        assert s.valid and s.coverage_plus == 1.0 and s.coverage_minus == 1.0
        assert abs(s.r_align) < 1e-4 and abs(s.delta_plus) < 1e-4 and abs(s.delta_minus) < 1e-4
        assert s.reward == pytest.approx(2 * ETA + s.r_skill) and abs(s.r_skill) < 1e-4


def _payload_mean(logps: list[float], row: TrainRow, tok) -> float:
    decode = lambda x: tok.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    flags = payload_mask(row.response_ids, decode)
    vals = [v for v, f in zip(logps, flags) if f]
    assert 0 < len(vals) < len(logps)  # think tokens, tags and EOS are not payload
    return sum(vals) / len(vals)


@pytest.mark.parametrize("micro", [1, 64])
def test_r_align_matches_independent_scoring(tiny_model_dir, tok, micro):
    rows = anchor_rows(tok)
    w = LearnerWorker(cfg(micro_batch_rows=micro), str(tiny_model_dir))
    req = request(tok, rows, "a")
    swapped = [
        rows[a.row_index].model_copy(update={"prompt_ids": a.swapped_prompt_ids})
        for a in req.plus + req.minus
    ]
    orig = w.score(rows)  # theta_old
    new = w.score(swapped)

    def j(anchors, scores_of):
        return sum(_payload_mean(scores_of(a), rows[a.row_index], tok) for a in anchors) / len(anchors)

    sw = dict(zip([a.row_index for a in req.plus + req.minus], new))
    d_plus = j(req.plus, lambda a: sw[a.row_index]) - j(req.plus, lambda a: orig[a.row_index])
    d_minus = j(req.minus, lambda a: sw[a.row_index]) - j(req.minus, lambda a: orig[a.row_index])
    m = w.train_step(rows, [proposal(tok, "a", "add")], [req])
    (s,) = m.proposal_scores
    assert s.delta_plus == pytest.approx(d_plus, abs=1e-5) and s.delta_minus == pytest.approx(
        d_minus, abs=1e-5
    )
    assert s.r_align == pytest.approx(d_plus - d_minus, abs=1e-5) and abs(s.r_align) > 1e-4
    assert s.r_skill == pytest.approx(max(-ETA, min(ETA, s.r_align)))
    assert s.valid and s.advantage == 0.0  # a single valid proposal has no baseline
    assert m.extra_metrics["prop_r_align_mean"] == pytest.approx(s.r_align)


def test_sampler_mode_scores_s_orig_in_the_learner_pass(tiny_model_dir, tok):
    """old_logprobs="sampler" (theta_old of the actor rows = the engine's, -1.0 per token here):
    J(s_orig) still comes from the learner pass that scores J(s~), never from the engine, so the
    sampler mode gives the recompute mode's Delta (a bf16 engine would otherwise bias it)."""
    rows = anchor_rows(tok)
    w = LearnerWorker(cfg(old_logprobs="sampler"), str(tiny_model_dir))
    req = request(tok, rows, "a")
    plus = [rows[a.row_index] for a in req.plus]
    swapped = w.score([r.model_copy(update={"prompt_ids": a.swapped_prompt_ids}) for r, a in zip(plus, req.plus)])
    orig = w.score(plus)
    j_swapped = sum(_payload_mean(v, r, tok) for v, r in zip(swapped, plus)) / 3
    j_orig = sum(_payload_mean(v, r, tok) for v, r in zip(orig, plus)) / 3
    assert abs(j_orig - (-1.0)) > 1e-3  # the engine's log-probs differ from the learner's here
    m = w.train_step(rows, [proposal(tok, "a", "add")], [req])
    assert m.proposal_scores[0].delta_plus == pytest.approx(j_swapped - j_orig, abs=1e-5)
    recompute = LearnerWorker(cfg(), str(tiny_model_dir)).train_step(rows, [proposal(tok, "a", "add")], [req])
    assert m.proposal_scores[0].r_align == pytest.approx(recompute.proposal_scores[0].r_align, abs=1e-6)


def test_rewards_gates_and_whitening(tiny_model_dir, tok):
    rows = anchor_rows(tok)
    long_skill = " ".join(["clean the mug"] * 20)
    normal = max(len(prompt(tok, SWAPPED, r.step_idx)) + len(r.response_ids) for r in rows)
    assert len(prompt(tok, long_skill, 0)) + len(rows[0].response_ids) > normal
    w = LearnerWorker(cfg(proposer={"max_scoring_tokens": normal}), str(tiny_model_dir))
    props = [
        proposal(tok, "ok", "add"),
        proposal(tok, "cov", "add"),
        proposal(tok, "long", "update"),
        proposal(tok, "unsup", "add", content_supported=False),
        proposal(tok, "zh", "add", has_chinese=True),
        proposal(tok, "none", "no_edit", r_op=-ETA),
        proposal(tok, "noop", "no_edit", r_op=None),
        proposal(tok, "fail", None, op_position=None),
        proposal(tok, "noreq", "add"),
    ]
    align = [
        request(tok, rows, "ok"),
        request(tok, rows, "cov", plus_turns=5),  # 3 of 5 turns: coverage 0.6
        request(tok, rows, "long", long_skill),
        request(tok, rows, "unsup"),
        request(tok, rows, "zh"),
    ]
    m = w.train_step(rows, props, align)
    s = {p.candidate_id: p for p in m.proposal_scores}
    assert [p.candidate_id for p in m.proposal_scores] == [p.candidate_id for p in props]
    assert s["ok"].valid and s["ok"].r_align is not None
    assert s["ok"].reward == pytest.approx(2 * ETA + max(-ETA, min(ETA, s["ok"].r_align)))
    assert not s["cov"].valid and s["cov"].reason == "plus coverage 0.6 < 0.8" and s["cov"].r_skill is None
    assert (
        s["cov"].coverage_plus == pytest.approx(0.6)
        and s["cov"].reward is None
        and s["cov"].advantage is None
    )
    assert not s["long"].valid and s["long"].reason == "prompt too long"
    assert s["unsup"].valid and s["unsup"].r_skill == -ETA and s["unsup"].reward == pytest.approx(ETA)
    assert s["zh"].r_skill == -ETA
    assert s["none"].valid and s["none"].reward == 0.0 and s["none"].r_skill is None
    assert not s["noop"].valid and s["noop"].reason == "no op verdict"
    assert s["fail"].valid and s["fail"].reward == -ETA and s["fail"].reason == "parse failure"
    assert not s["noreq"].valid and s["noreq"].reason == "no align request"
    valid = [p for p in m.proposal_scores if p.valid]
    expected = whiten_rewards(torch.tensor([p.reward for p in valid]))
    torch.testing.assert_close(torch.tensor([p.advantage for p in valid]), expected)
    e = m.extra_metrics
    assert e["prop_rows"] == 9 and e["prop_valid_rows"] == len(valid) == 5
    assert e["prop_op_add"] == pytest.approx(5 / 9) and e["prop_op_parse_fail"] == pytest.approx(1 / 9)
    assert e["prop_reward_mean"] == pytest.approx(sum(p.reward for p in valid) / 5)
    assert e["prop_support_rows"] == 4  # valid rows with a decision position


def test_warmup_uses_r_fmt_only(tiny_model_dir, tok):
    rows = anchor_rows(tok)
    w = LearnerWorker(cfg(), str(tiny_model_dir))
    props = [
        proposal(tok, "a", "add"),
        proposal(tok, "b", None, op_position=None),
        proposal(tok, "c", "no_edit"),
    ]
    m = w.train_step(rows, props, [request(tok, rows, "a")], proposer_warmup=True)
    assert [s.reward for s in m.proposal_scores] == [ETA, -ETA, ETA]
    assert all(s.valid and s.reason == "warm-up" and s.r_align is None for s in m.proposal_scores)
    m4 = w.train_step(rows, props, [request(tok, rows, "a")])
    assert m4.proposal_scores[0].r_align is not None and m4.proposal_scores[0].reason == ""


def test_lambda_zero_is_exactly_the_actor_step(tiny_model_dir, tok, make_rows):
    rows = anchor_rows(tok) + make_rows()[:6]
    props = [proposal(tok, "a", "add"), proposal(tok, "b", "no_edit", r_op=-ETA)]
    # beta_kl > 0 loads a reference model for the proposer alone: the actor must not change
    w0 = LearnerWorker(cfg(proposer={"lambda_prop": 0.0, "beta_kl": 0.02}), str(tiny_model_dir))
    m0 = w0.train_step(rows, props, [request(tok, rows, "a")])
    w1 = LearnerWorker(cfg(proposer={"enabled": False}), str(tiny_model_dir))
    m1 = w1.train_step(rows)
    assert max_param_diff(params(w0), params(w1)) == 0.0
    assert m0.num_optimizer_steps == m1.num_optimizer_steps and m0.loss == m1.loss
    assert m1.proposal_scores == [] and not any(k.startswith("prop_") for k in m1.extra_metrics)


def test_joint_step_changes_the_update_and_is_split_invariant(tiny_model_dir, tok, make_rows):
    rows = anchor_rows(tok) + make_rows()[:6]
    props = [
        proposal(tok, "a", "add"),
        proposal(tok, "b", "no_edit", r_op=-ETA),
        proposal(tok, "c", "update", content_supported=False),
        proposal(tok, "d", None, op_position=None),
        proposal(tok, "e", "no_edit"),
    ]
    align = [request(tok, rows, "a"), request(tok, rows, "c")]
    mini = len(rows) // 2 + 1  # two actor mini-batches -> two optimiser steps
    runs = []
    for micro in (3, 64):
        w = LearnerWorker(
            cfg(micro_batch_rows=micro, mini_batch_rows=mini, temperature=0.05, proposer={"beta_kl": 0.02}),
            str(tiny_model_dir),
        )
        m = w.train_step(rows, props, align)
        runs.append((params(w), m))
    p0, m0 = runs[0]
    assert m0.num_optimizer_steps == 2  # the proposer adds no optimiser step
    for p, m in runs[1:]:
        assert max_param_diff(p0, p) < 1e-6
        assert m.loss == pytest.approx(m0.loss, rel=1e-5, abs=1e-6)
        for key in ("prop_loss", "prop_pg_loss", "prop_sup_loss", "prop_kl_loss"):
            # temperature 0.05 multiplies the logits by 20: float32 summation order shows at ~1e-7 relative
            assert m.extra_metrics[key] == pytest.approx(m0.extra_metrics[key], rel=1e-5, abs=1e-6)
    w_actor = LearnerWorker(
        cfg(mini_batch_rows=mini, temperature=0.05, proposer={"enabled": False}), str(tiny_model_dir)
    )
    m_actor = w_actor.train_step(rows)
    assert max_param_diff(p0, params(w_actor)) > 1e-5
    e = m0.extra_metrics
    assert e["prop_sup_loss"] > 0  # temperature 0.05 sharpens the op distribution below p_min
    expected = e["prop_pg_loss"] + 0.02 * e["prop_kl_loss"] + 0.01 * e["prop_sup_loss"]
    assert e["prop_loss"] == pytest.approx(expected, rel=1e-5)
    # the joint loss: actor terms + lambda_prop * L_prop
    assert m0.loss == pytest.approx(m0.pg_loss + 0.5 * e["prop_loss"], abs=1e-6)
    assert not {k for k in m_actor.extra_metrics if not k.startswith("mismatch/")} and m_actor.num_optimizer_steps == 2


def test_support_loss_matches_theta_old_decision_logits(tiny_model_dir, tok):
    rows = anchor_rows(tok)
    props = [proposal(tok, "a", "add"), proposal(tok, "b", "update"), proposal(tok, "c", "no_edit")]
    c = cfg(temperature=0.05, shuffle_rows=False)
    w = LearnerWorker(c, str(tiny_model_dir))
    prop_rows = [
        TrainRow(prompt_ids=p.prompt_ids, response_ids=p.response_ids, sampler_logprobs=(0.0,) * len(p.response_ids),
                 group_id="p", traj_id=p.candidate_id, step_idx=0, episode_score=0.0, action_valid=True)
        for p in props
    ]  # fmt: skip
    batch = collate_rows(prop_rows, pad_token_id=w._pad_id)
    with torch.no_grad():
        logits = response_logits(w.backend.module, batch, temperature=0.05)
    op = torch.tensor([p.op_token_ids for p in props])
    legal = torch.tensor([p.legal_ops for p in props])
    expected = support_regularizer(logits[:, 0].gather(-1, op), legal).mean().item()
    m = w.train_step(rows, props, [], proposer_warmup=True)  # warm-up: rewards r_fmt, all valid
    assert expected > 0
    assert m.extra_metrics["prop_sup_loss"] == pytest.approx(expected, rel=1e-4)
    assert m.extra_metrics["prop_pg_loss"] == pytest.approx(0.0, abs=1e-7)  # constant rewards -> A = 0
    off = LearnerWorker(cfg(temperature=0.05, proposer={"support_regularizer": False}), str(tiny_model_dir))
    m_off = off.train_step(rows, props, [], proposer_warmup=True)
    assert m_off.extra_metrics["prop_sup_loss"] == 0.0 and m_off.extra_metrics["prop_support_rows"] == 0


def test_bad_inputs_name_the_problem(tiny_model_dir, tok):
    rows = anchor_rows(tok)
    p = proposal(tok, "a", "add")
    off = LearnerWorker(cfg(proposer={"enabled": False}), str(tiny_model_dir))
    with pytest.raises(ValueError, match="proposer.enabled"):
        off.train_step(rows, [p])
    w = LearnerWorker(cfg(), str(tiny_model_dir))
    with pytest.raises(ValueError, match="unknown candidate 'z'"):
        w.train_step(rows, [p], [request(tok, rows, "z")])
    with pytest.raises(ValueError, match="unique"):
        w.train_step(rows, [p, p])
    bad = AlignRequest(
        candidate_id="a", plus=(AlignAnchor(row_index=99, swapped_prompt_ids=(1, 2)),), minus=(),
        plus_turns=1, minus_turns=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="row_index 99"):
        w.train_step(rows, [p], [bad])
    with pytest.raises(ValueError, match="payload_mask"):
        TrainRow(**{**rows[0].model_dump(), "payload_mask": (True,)})


def test_explicit_payload_mask_is_used(tiny_model_dir, tok):
    rows = anchor_rows(tok)
    # flag only the first response token of every anchor row: J then scores that token alone
    flagged = [
        r.model_copy(update={"payload_mask": (True,) + (False,) * (len(r.response_ids) - 1)}) for r in rows
    ]
    w = LearnerWorker(cfg(), str(tiny_model_dir))
    req = request(tok, rows, "a")
    orig = w.score(rows)
    swapped = w.score(
        [rows[a.row_index].model_copy(update={"prompt_ids": a.swapped_prompt_ids}) for a in req.plus]
    )
    d_plus = sum(s[0] for s in swapped) / 3 - sum(orig[a.row_index][0] for a in req.plus) / 3
    m = w.train_step(flagged, [proposal(tok, "a", "add")], [req])
    assert m.proposal_scores[0].delta_plus == pytest.approx(d_plus, abs=1e-5)


def _rank_main(rank: int, model_dir: str, port: int, out_dir: str, payload: str) -> None:
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    data = json.loads(payload)
    rows = [TrainRow.model_validate(r) for r in data["rows"]]
    props = [ProposalRow.model_validate(p) for p in data["props"]]
    align = [AlignRequest.model_validate(a) for a in data["align"]]
    c = LearnerConfig.model_validate({**data["cfg"], "use_deepspeed": True, "zero_stage": 1})
    w = LearnerWorker(c, model_dir, rank=rank, world_size=2, master_port=port)
    metrics = w.train_step(rows, props, align)
    w.export_weights(out_dir)
    if rank == 0:
        Path(out_dir, "metrics.json").write_text(metrics.model_dump_json())


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("ragged", [False, True])
def test_two_deepspeed_ranks_match_one_torch_rank(
    tiny_model_dir, tok, make_rows, free_port, tmp_path, ragged
):
    """Global-batch semantics over DP ranks: R_align (anchor rows owned by either rank, swapped
    rows split over ranks), whitening over all proposals, proposer denominators over both ranks.
    ragged: a last mini-batch of one actor row and one proposal, and one SMRC-SD teacher row, so
    one rank has no row, no proposal and no teacher row to train on there (padding only)."""
    import multiprocessing as mp

    from safetensors.torch import load_file

    rows = anchor_rows(tok) + make_rows()[:6]
    props = [
        proposal(tok, "a", "add"),
        proposal(tok, "b", "no_edit", r_op=-ETA),
        proposal(tok, "c", "update"),
        proposal(tok, "d", None, op_position=None),
        proposal(tok, "e", "add", content_supported=False),
    ]
    align = [request(tok, rows, "a"), request(tok, rows, "c", "clean the mug"), request(tok, rows, "e")]
    c = cfg(micro_batch_rows=2, shuffle_rows=False, temperature=0.3, proposer={"beta_kl": 0.02})
    if ragged:  # 3 valid proposals over 2 mini-batches: 2 + 1
        rows = [r.model_copy(update={"teacher_prompt_ids": (5, *r.prompt_ids) if i == 0 else None})
                for i, r in enumerate(rows)]  # fmt: skip
        props, align = props[:3], align[:2]
        c = c.model_copy(update={"mini_batch_rows": len(rows) - 1, "sd": DistillConfig(coef=0.3)})
    payload = json.dumps(
        {
            "rows": [r.model_dump() for r in rows],
            "props": [p.model_dump() for p in props],
            "align": [a.model_dump() for a in align],
            "cfg": c.model_dump(),
        }
    )
    ctx, port, out = mp.get_context("spawn"), free_port(), tmp_path / "dp2"
    procs = [
        ctx.Process(target=_rank_main, args=(r, str(tiny_model_dir), port, str(out), payload)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    single = LearnerWorker(c, str(tiny_model_dir))
    m_single = single.train_step(rows, props, align)
    got = load_file(str(out / "model.safetensors"))
    for k, v in single.backend.module.state_dict().items():
        if k in got:
            torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0, msg=k)
    m_dp = json.loads((out / "metrics.json").read_text())
    for s_dp, s_one in zip(m_dp["proposal_scores"], m_single.proposal_scores):
        assert s_dp["valid"] == s_one.valid and s_dp["reason"] == s_one.reason
        for key in ("r_align", "delta_plus", "advantage"):
            one = getattr(s_one, key)
            assert (s_dp[key] is None) == (one is None)
            if one is not None:
                assert s_dp[key] == pytest.approx(one, abs=1e-5)
    assert sum(s.r_align is not None for s in m_single.proposal_scores) == len(align)
    if ragged:
        assert m_single.num_optimizer_steps == 2 and m_dp["extra_losses"]["sd"] != 0
        assert m_dp["extra_losses"]["sd"] == pytest.approx(m_single.extra_losses["sd"], rel=1e-4, abs=1e-9)
    for key in ("prop_loss", "prop_sup_loss", "prop_kl_loss"):
        assert m_dp["extra_metrics"][key] == pytest.approx(m_single.extra_metrics[key], rel=1e-4, abs=1e-6)
    assert m_dp["loss"] == pytest.approx(m_single.loss, rel=1e-4, abs=1e-6)


def test_proposer_only_update_ignores_the_actor_rows(tiny_model_dir, tok, make_rows):
    """Variant proposer_only (train_actor false): the actor loss is logged but contributes no
    gradient, so the update depends on the proposals alone: flipping every actor row's outcome
    (new advantages, a new actor loss) leaves the weights identical, while the full method's
    update moves with it; with neither role trained nothing moves at all."""
    rows = anchor_rows(tok) + make_rows()[:6]
    flipped = [r.model_copy(update={"episode_score": 10.0 - r.episode_score}) for r in rows]
    props = [proposal(tok, "a", "add"), proposal(tok, "b", "no_edit", r_op=-ETA), proposal(tok, "e", "no_edit")]
    align = [request(tok, rows, "a")]
    after = {}
    for train_actor in (False, True):
        for name, batch in (("rows", rows), ("flipped", flipped)):
            w = LearnerWorker(cfg(kl_coef=0.01, entropy_coeff=0.01, proposer={"train_actor": train_actor}),
                              str(tiny_model_dir))
            m = w.train_step(batch, props, align)
            assert m.extra_metrics["prop_valid_rows"] == 3 and m.pg_loss != 0.0  # the actor loss is still logged
            after[train_actor, name] = (params(w), m)
    assert max_param_diff(after[False, "rows"][0], after[False, "flipped"][0]) == 0.0
    assert after[False, "rows"][1].pg_loss != pytest.approx(after[False, "flipped"][1].pg_loss)
    assert max_param_diff(after[True, "rows"][0], after[True, "flipped"][0]) > 1e-5
    w = LearnerWorker(cfg(proposer={"train_actor": False}), str(tiny_model_dir))
    start = params(w)
    assert max_param_diff(start, after[False, "rows"][0]) > 1e-5  # the proposer alone moves the weights
    frozen = LearnerWorker(cfg(proposer={"train_actor": False, "train_proposer": False}), str(tiny_model_dir))
    frozen.train_step(rows, props, align)
    assert max_param_diff(start, params(frozen)) == 0.0


def test_wholly_forced_anchor_turn_counts_for_coverage_not_for_j(tiny_model_dir, tok):
    """An anchor turn decoded with one allowed id per position (log-prob 0 under any prompt) is
    covered but left out of J: Delta+ is the mean over the other two turns of tau+."""
    rows = anchor_rows(tok)
    rows[0] = rows[0].model_copy(update={"allowed_token_ids": tuple((i,) for i in rows[0].response_ids)})
    w = LearnerWorker(cfg(), str(tiny_model_dir))
    req = request(tok, rows, "a")
    free = [a for a in req.plus if a.row_index != 0]
    swapped = w.score([rows[a.row_index].model_copy(update={"prompt_ids": a.swapped_prompt_ids}) for a in free])
    orig = w.score([rows[a.row_index] for a in free])
    d_plus = sum(_payload_mean(s, rows[a.row_index], tok) - _payload_mean(o, rows[a.row_index], tok)
                 for s, o, a in zip(swapped, orig, free)) / 2
    (s,) = w.train_step(rows, [proposal(tok, "a", "add")], [req]).proposal_scores
    assert s.coverage_plus == 1.0 and s.r_align is not None
    assert s.delta_plus == pytest.approx(d_plus, abs=1e-5)


def test_token_budget_leaves_the_proposer_passes_unchanged(tiny_model_dir, tok, make_rows, monkeypatch):
    # The scoring pass and the proposer update pack by learner.max_tokens_per_micro_batch, as the
    # actor pass does: R_align, the proposer losses and the weights do not depend on the split.
    import learner.proposer_loss as pl
    import learner.proposer_pass as pp

    sizes: dict[str, list[int]] = {"scoring": [], "update": []}

    def recording(real, key):
        def shard(*args, **kwargs):
            chunks = real(*args, **kwargs)
            sizes[key].extend(len(idx) for idx, _ in chunks)
            return chunks
        return shard

    monkeypatch.setattr(pp, "shard_micro_batches", recording(pp.shard_micro_batches, "scoring"))
    monkeypatch.setattr(pl, "shard_micro_batches", recording(pl.shard_micro_batches, "update"))
    rows = anchor_rows(tok) + make_rows()[:6]
    props = [proposal(tok, "a", "add"), proposal(tok, "b", "no_edit", r_op=-ETA), proposal(tok, "e", "update")]
    align = [request(tok, rows, "a"), request(tok, rows, "e")]
    runs = []
    for budget in (None, 100, 1):
        for v in sizes.values():
            v.clear()
        w = LearnerWorker(cfg(max_tokens_per_micro_batch=budget, mini_batch_rows=len(rows) // 2 + 1,
                              proposer={"beta_kl": 0.02}), str(tiny_model_dir))  # fmt: skip
        m = w.train_step(rows, props, align)
        runs.append((params(w), m, {k: list(v) for k, v in sizes.items()}))
    p0, m0, fixed = runs[0]
    assert max(fixed["scoring"]) == 4 and set(runs[2][2]["scoring"]) == set(runs[2][2]["update"]) == {1}
    assert runs[1][2]["scoring"] != fixed["scoring"]  # the budget reached both passes
    assert all(s.r_align is not None for s in m0.proposal_scores if s.candidate_id != "b")
    for p, m, _ in runs[1:]:
        assert max_param_diff(p0, p) < 1e-6
        assert m.loss == pytest.approx(m0.loss, rel=1e-5, abs=1e-6)
        for a, b in zip(m.proposal_scores, m0.proposal_scores):
            assert a.valid == b.valid
            assert (a.r_align is None) == (b.r_align is None)
            if a.r_align is not None:
                assert a.r_align == pytest.approx(b.r_align, abs=1e-5)
        for key in ("prop_loss", "prop_pg_loss", "prop_sup_loss", "prop_kl_loss"):
            assert m.extra_metrics[key] == pytest.approx(m0.extra_metrics[key], rel=1e-5, abs=1e-6)
