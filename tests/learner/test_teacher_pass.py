"""SMRC-SD teacher pass in the learner (docs/algorithms.md S2, d; S7 SD 2, 6, 7): teacher rows, the
no-grad teacher scoring at theta_old, the routed "sd" loss wired through `LearnerConfig.sd`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from learner.batch import collate_rows, rows_from_trajectories, teacher_rows
from learner.config import DistillConfig, LearnerConfig
from learner.types import TrainRow
from learner.worker import LearnerWorker


def cfg(coef: float = 0.0, **kw) -> LearnerConfig:
    # eps=1 keeps AdamW's update proportional to the gradient (see test_worker_torch).
    sd = kw.pop("sd", {})
    base = {"lr": 1e-3, "use_deepspeed": False, "kl_coef": 0.0, "micro_batch_rows": 4, "seed": 3, "eps": 1.0}
    return LearnerConfig(**{**base, **kw}, sd=DistillConfig(coef=coef, **sd))


def params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.backend.module.named_parameters()}


def max_param_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def with_teacher(rows: list[TrainRow], prompt_of) -> list[TrainRow]:
    """rows with teacher_prompt_ids = prompt_of(i, row) (None = unmatched)."""
    return [r.model_copy(update={"teacher_prompt_ids": prompt_of(i, r)}) for i, r in enumerate(rows)]


def teacher_and_old(worker: LearnerWorker, rows: list[TrainRow]):
    batch = collate_rows(rows, pad_token_id=worker._pad_id)
    minis = worker._mini_batches(batch.num_rows)
    old = worker._old_pass(batch, worker._shards(batch, minis))
    return worker._teacher_pass(rows, batch, minis), old, batch


def train(tiny_model_dir, rows, coef, **kw):
    w = LearnerWorker(cfg(coef, **kw), str(tiny_model_dir))
    m = w.train_step(rows)
    return params(w), m


def test_teacher_rows_and_rows_from_trajectories():
    turn = lambda p: SimpleNamespace(
        prompt_ids=p, response_ids=[5, 6], sampler_logprobs=[-1.0, -2.0],
        allowed_token_ids=[[5, 7], [6]], action_valid=True,
    )  # fmt: skip
    trajs = [
        SimpleNamespace(group_id="g", traj_id="a", score=1.0, turns=[turn([1, 2]), turn([3])]),
        SimpleNamespace(group_id="g", traj_id="b", score=0.0, turns=[turn([4])]),
    ]
    rows = rows_from_trajectories(trajs, {("a", 1): [9, 9, 3]})
    assert [r.teacher_prompt_ids for r in rows] == [None, (9, 9, 3), None]
    assert all(r.teacher_prompt_ids is None for r in rows_from_trajectories(trajs))
    (t,) = teacher_rows(rows)
    assert t.prompt_ids == (9, 9, 3) and t.teacher_prompt_ids is None
    assert t.response_ids == rows[1].response_ids and t.allowed_token_ids == rows[1].allowed_token_ids


@pytest.mark.parametrize("old_logprobs", ["recompute", "sampler"])
def test_student_prompt_as_teacher_matches_old_and_gives_zero_sd(tiny_model_dir, make_rows, old_logprobs):
    # S7 SD-6: alignment of the teacher-batch builder; then d = 0 and the SD gradient is 0.
    rows = with_teacher(make_rows(), lambda i, r: r.prompt_ids)
    w = LearnerWorker(cfg(0.5, old_logprobs=old_logprobs), str(tiny_model_dir))
    teacher, _, batch = teacher_and_old(w, rows)
    assert teacher.match.all()
    assert not teacher.teacher_logp.requires_grad
    w0 = LearnerWorker(cfg(0.0), str(tiny_model_dir))
    recompute_old = w0._old_pass(batch, w0._shards(batch, [torch.arange(batch.num_rows)])).old_logp
    torch.testing.assert_close(teacher.teacher_logp, recompute_old, atol=1e-5, rtol=0)

    p_sd, m_sd = train(tiny_model_dir, rows, 0.5, old_logprobs=old_logprobs)
    p_0, m_0 = train(tiny_model_dir, rows, 0.0, old_logprobs=old_logprobs)
    assert max_param_diff(p_sd, p_0) < 1e-6
    assert abs(m_sd.extra_losses["sd"]) < 1e-6
    assert "sd" not in m_0.extra_losses and not {k for k in m_0.extra_metrics if not k.startswith("mismatch/")}
    assert m_sd.extra_metrics["sd_match_rate"] == 1.0
    assert m_sd.extra_metrics["sd_teacher_tokens"] == m_sd.num_tokens
    assert abs(m_sd.extra_metrics["sd_d_mean"]) < 1e-5 and abs(m_sd.extra_metrics["sd_k_mean"]) < 1e-6


def test_extra_left_padding_leaves_teacher_logp_unchanged(tiny_model_dir, make_rows):
    # S7 SD-7: a row with a much longer teacher prompt left-pads every other teacher prompt.
    rows = make_rows()
    base = with_teacher(rows, lambda i, r: r.prompt_ids if i < 4 else None)
    padded = with_teacher(
        rows, lambda i, r: r.prompt_ids if i < 4 else (r.prompt_ids * 6 if i == 4 else None)
    )
    w = LearnerWorker(cfg(0.5, micro_batch_rows=64, shuffle_rows=False), str(tiny_model_dir))
    a, _, _ = teacher_and_old(w, base)
    b, _, _ = teacher_and_old(w, padded)
    assert max(len(r.teacher_prompt_ids or ()) for r in padded) > 2 * max(len(r.prompt_ids) for r in rows[:4])
    torch.testing.assert_close(a.teacher_logp[:4], b.teacher_logp[:4], atol=1e-5, rtol=0)
    assert (b.teacher_logp[4] != 0).any() and (a.teacher_logp[4:] == 0).all()


@pytest.mark.parametrize("denominator", ["all_tokens", "matched_tokens"])
def test_unmatched_batch_is_exactly_grpo(tiny_model_dir, make_rows, denominator):
    # S7 SD-2: M = 0 everywhere -> L = L_GRPO exactly.
    rows = make_rows()
    p_sd, m_sd = train(tiny_model_dir, rows, 0.5, sd={"denominator": denominator})
    p_0, m_0 = train(tiny_model_dir, rows, 0.0)
    assert max_param_diff(p_sd, p_0) == 0.0
    assert m_sd.extra_losses["sd"] == 0.0 and m_sd.loss == m_0.loss
    assert m_sd.extra_metrics["sd_match_rate"] == 0.0 and m_sd.extra_metrics["sd_teacher_tokens"] == 0.0


@pytest.mark.parametrize("old_logprobs", ["recompute", "sampler"])
@pytest.mark.parametrize("form", ["rkl", "sdar"])
def test_teacher_prompt_changes_the_update(tiny_model_dir, make_rows, old_logprobs, form):
    rows = make_rows()
    routed = with_teacher(rows, lambda i, r: (7, 8, 9) + r.prompt_ids if i % 3 == 0 else None)
    n_matched = sum(r.teacher_prompt_ids is not None for r in routed)
    kw = {"old_logprobs": old_logprobs, "eps": 1e-8}  # Adam's sign-like steps make the SD term visible
    p_sd, m_sd = train(tiny_model_dir, routed, 0.5, sd={"form": form}, **kw)
    p_0, _ = train(tiny_model_dir, routed, 0.0, **kw)
    assert max_param_diff(p_sd, p_0) > 1e-5
    assert m_sd.extra_metrics["sd_match_rate"] == pytest.approx(n_matched / len(rows))
    lengths = [len(r.response_ids) for r in routed if r.teacher_prompt_ids is not None]
    assert m_sd.extra_metrics["sd_teacher_tokens"] == sum(lengths)
    if form == "rkl":
        assert m_sd.extra_losses["sd"] > 0 and m_sd.extra_metrics["sd_k_mean"] > 0
    assert m_sd.extra_metrics["sd_d_mean"] != 0


def test_matched_tokens_denominator(tiny_model_dir, make_rows):
    rows = with_teacher(make_rows(), lambda i, r: (7, 8, 9) + r.prompt_ids if i % 2 == 0 else None)
    _, m_all = train(tiny_model_dir, rows, 0.5)
    _, m_matched = train(tiny_model_dir, rows, 0.5, sd={"denominator": "matched_tokens"})
    total = sum(len(r.response_ids) for r in rows)
    matched = m_all.extra_metrics["sd_teacher_tokens"]
    assert m_matched.extra_losses["sd"] == pytest.approx(m_all.extra_losses["sd"] * total / matched, rel=1e-5)


def test_config_validation():
    with pytest.raises(ValueError):
        DistillConfig(warm_down=True)
    with pytest.raises(ValueError):
        DistillConfig(coef=-1.0)
    with pytest.raises(ValueError):
        DistillConfig(bogus=1)
    assert LearnerConfig().sd.coef == 0.0


def test_token_budget_leaves_the_teacher_pass_and_the_update_unchanged(tiny_model_dir, make_rows, monkeypatch):
    # The teacher rows are packed by learner.max_tokens_per_micro_batch under their own (longer)
    # lengths, as the actor pass is: the teacher log-probs, the SD loss and the weights do not move.
    import learner.teacher_pass as tp

    rows = with_teacher(make_rows(), lambda i, r: (7, 8, 9) * (1 + i % 4) + r.prompt_ids if i % 2 == 0 else None)
    sizes: list[list[int]] = []
    real_chunks = tp.teacher_chunks

    def recording_chunks(*args, **kwargs):
        chunks = real_chunks(*args, **kwargs)
        sizes.append([len(idx) for idx, _ in chunks])
        return chunks

    monkeypatch.setattr(tp, "teacher_chunks", recording_chunks)
    results = []
    for budget in (None, 40, 1):
        w = LearnerWorker(cfg(0.5, max_tokens_per_micro_batch=budget), str(tiny_model_dir))
        teacher, _, _ = teacher_and_old(w, rows)
        m = w.train_step(rows)
        results.append((teacher.teacher_logp, m, params(w)))
    fixed, packed, one_each = sizes[::2]  # each worker runs the teacher pass twice
    assert fixed == [4, 2] and packed != fixed and set(one_each) == {1}  # the budget reached the pass
    logp0, m0, p0 = results[0]
    assert (logp0 != 0).any() and m0.extra_losses["sd"] > 0
    for logp, m, p in results[1:]:
        torch.testing.assert_close(logp, logp0, atol=1e-5, rtol=0)
        assert m.extra_losses["sd"] == pytest.approx(m0.extra_losses["sd"], rel=1e-5, abs=1e-7)
        assert m.loss == pytest.approx(m0.loss, abs=1e-5)
        assert max_param_diff(p, p0) < 1e-6
