"""Routed self-distillation math: docs/algorithms.md S7 "SD" cases 1-5, 8, 9 on pure tensors and a
toy categorical (exact expectations by enumerating the vocabulary), plus SDAR's gated form, the
lambda warm-down and the `ExtraLoss` hook on real collated micro-batches. No model."""

from __future__ import annotations

import itertools

import pytest
import torch

from learner.algos import agg_loss
from learner.batch import collate_rows, select_rows
from learner.distill import (
    RoutedSDLoss,
    lambda_schedule,
    routed_sd_loss,
    sd_denominator,
    sd_reverse_kl_terms,
    sdar_gated_terms,
)
from learner.types import MicroBatchView

T = torch.tensor
F64 = torch.float64


def rand_batch(seed: int = 0, b: int = 4, length: int = 6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, length, generator=gen, dtype=F64) * 3
    teacher = -torch.rand(b, length, generator=gen, dtype=F64) * 3
    old = logp + 0.1 * torch.randn(b, length, generator=gen, dtype=F64)
    lengths = torch.randint(1, length + 1, (b,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(F64)
    return logp, teacher, old, mask


# --- S7.SD.1: teacher == student at theta == theta_old -> exactly 0 loss and gradient --------


def test_identical_teacher_gives_zero_loss_and_gradient():
    logp0, _, _, mask = rand_batch()
    logp = logp0.clone().requires_grad_(True)
    per_token = sd_reverse_kl_terms(logp, logp0.clone(), logp0.clone())
    assert torch.equal(per_token.detach(), torch.zeros_like(logp0))
    loss = routed_sd_loss(per_token, mask, torch.ones(4, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros_like(logp0))


# --- S7.SD.2: unmatched rows contribute nothing -------------------------------------------------


def test_all_unmatched_gives_zero_loss_and_gradient():
    logp0, teacher, old, mask = rand_batch(1)
    logp = logp0.clone().requires_grad_(True)
    per_token = sd_reverse_kl_terms(logp, teacher, old)
    assert per_token.detach().abs().sum() > 0
    for denominator in ("all_tokens", "matched_tokens"):
        logp.grad = None
        loss = routed_sd_loss(per_token, mask, torch.zeros(4, dtype=torch.bool), denominator=denominator)
        loss.backward(retain_graph=True)
        assert loss.item() == 0.0
        assert torch.equal(logp.grad, torch.zeros_like(logp0))


def test_unmatched_rows_get_no_gradient_and_nonfinite_values_do_not_leak():
    logp0, teacher, old, mask = rand_batch(2)
    logp = logp0.clone().requires_grad_(True)
    match = T([True, False, True, False])
    routed_sd_loss(sd_reverse_kl_terms(logp, teacher, old), mask, match).backward()
    assert torch.equal(logp.grad[~match], torch.zeros_like(logp0[~match]))
    assert (logp.grad[match] * mask[match]).abs().sum() > 0
    assert torch.equal(logp.grad * (1 - mask), torch.zeros_like(logp0))
    values = sd_reverse_kl_terms(logp0, teacher, old)
    values[~match] = float("inf")
    values[mask == 0] = float("nan")
    assert torch.isfinite(routed_sd_loss(values, mask, match))


# --- S7.SD.3: M == 1 reproduces the unrouted (FullPath-SD) loss --------------------------------


def test_all_matched_equals_unrouted_token_mean():
    logp0, teacher, old, mask = rand_batch(3)
    per_token = sd_reverse_kl_terms(logp0, teacher, old)
    ones = torch.ones(4, dtype=torch.bool)
    expected = agg_loss(per_token, mask, "token-mean")
    for denominator in ("all_tokens", "matched_tokens"):
        got = routed_sd_loss(per_token, mask, ones, denominator=denominator)
        torch.testing.assert_close(got, expected)
    w = T([1.0, 0.5, 2.0, 0.0], dtype=F64)
    torch.testing.assert_close(
        routed_sd_loss(per_token, mask, ones, row_weights=w),
        agg_loss(per_token, mask, "token-mean", row_weights=w),
    )


# --- S7.SD.4: exact gradient identity on a toy categorical ----------------------------------------


V = 7


def toy(seed: int):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=gen, dtype=F64)
    z_old = z + 0.3 * torch.randn(V, generator=gen, dtype=F64)
    teacher = torch.log_softmax(torch.randn(V, generator=gen, dtype=F64) * 1.5, -1)
    return z, z_old, teacher


def reverse_kl_grad(z: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Analytic d/dz KL(pi_z || pi_T) = pi * (log pi - log pi_T - KL)."""
    logpi = torch.log_softmax(z, -1)
    pi = logpi.exp()
    kl = (pi * (logpi - teacher)).sum()
    return pi * (logpi - teacher - kl)


def expected_grad(z0: torch.Tensor, sampler_logp: torch.Tensor, per_token_fn) -> torch.Tensor:
    """E_{y ~ exp(sampler_logp)}[grad_z l(y)], exact: sum over all V tokens, sampler weights detached."""
    z = z0.clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1)  # every token y of the vocabulary as its own "sample"
    (sampler_logp.exp().detach() * per_token_fn(logp)).sum().backward()
    return z.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("on_policy", [True, False])
def test_expected_gradient_is_the_reverse_kl_gradient(seed, on_policy):
    z, z_old, teacher = toy(seed)
    old = torch.log_softmax(z if on_policy else z_old, -1).detach()
    got = expected_grad(z, old, lambda logp: sd_reverse_kl_terms(logp, teacher, old))
    torch.testing.assert_close(got, reverse_kl_grad(z, teacher), atol=1e-12, rtol=1e-10)


def test_expected_value_is_the_reverse_kl():
    z, z_old, teacher = toy(4)
    logpi, old = torch.log_softmax(z, -1), torch.log_softmax(z_old, -1)
    value = (old.exp() * sd_reverse_kl_terms(logpi, teacher, old)).sum()
    torch.testing.assert_close(value, (logpi.exp() * (logpi - teacher)).sum())


def test_pitfalls_unweighted_k3_is_forward_kl_and_log_ratio_has_zero_gradient():
    """docs/algorithms.md c pitfalls 1-2: what the w weight is for."""
    z, _, teacher = toy(5)
    on = torch.log_softmax(z, -1).detach()

    def k3(logp):
        d = logp - teacher
        return torch.exp(-d) - 1 + d

    forward_kl_grad = on.exp() - teacher.exp()  # d/dz KL(pi_T || pi_z)
    torch.testing.assert_close(expected_grad(z, on, k3), forward_kl_grad, atol=1e-12, rtol=1e-10)
    log_ratio = expected_grad(z, on, lambda logp: logp - teacher)
    torch.testing.assert_close(log_ratio, torch.zeros(V, dtype=F64), atol=1e-12, rtol=0)


def test_per_sample_gradient_is_w_times_d():
    logp0, teacher, old, _ = rand_batch(6)
    logp = logp0.clone().requires_grad_(True)
    sd_reverse_kl_terms(logp, teacher, old).sum().backward()
    torch.testing.assert_close(logp.grad, (logp0 - old).exp() * (logp0 - teacher))


def test_clamps_keep_values_finite():
    logp = T([[-50.0, 0.0]], dtype=F64, requires_grad=True)
    teacher = T([[0.0, -50.0]], dtype=F64)
    old = T([[-50.0, -100.0]], dtype=F64)  # log-ratio 0 and 100 -> w clamped to e^10
    out = sd_reverse_kl_terms(logp, teacher, old, ratio_clamp=10.0, neg_clamp=20.0)
    torch.testing.assert_close(out[0, 0], torch.exp(T(20.0, dtype=F64)) - 1 - 50)
    torch.testing.assert_close(
        out[0, 1], torch.exp(T(10.0, dtype=F64)) * (torch.exp(T(-50.0, dtype=F64)) - 1 + 50)
    )
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()
    # ratio clamp active at [0, 1]: no gradient through w, only w * dk/dlogp = e^10 (1 - e^-d)
    torch.testing.assert_close(
        logp.grad[0, 1], torch.exp(T(10.0, dtype=F64)) * (1 - torch.exp(T(-50.0, dtype=F64)))
    )
    # neg clamp active at [0, 0] (d = -50): straight-through, the gradient is still w * d = -50
    torch.testing.assert_close(logp.grad[0, 0], T(-50.0, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_gradient_is_w_times_d_for_every_d(dtype):
    """d = logp - teacher over [-40, 40], on both sides of the neg clamp (20): the gradient is
    w * d everywhere (the clamp once gave ~ +4.9e8 of the wrong sign below d = -20), and the
    value stays finite."""
    d = torch.linspace(-40.0, 40.0, 161, dtype=dtype)
    old = torch.full_like(d, -3.0)
    for shift in (0.0, -0.7, 0.5):  # w = e^shift
        logp = (old + shift).clone().requires_grad_(True)
        teacher = logp.detach() - d
        out = sd_reverse_kl_terms(logp, teacher, old)
        out.sum().backward()
        expected = torch.exp(torch.tensor(shift, dtype=dtype)) * d
        torch.testing.assert_close(logp.grad, expected, rtol=1e-5, atol=1e-5)
        assert torch.isfinite(out).all() and (out >= 0).all()


# --- S7.SD.5: the teacher carries no gradient ---------------------------------------------------


def test_teacher_and_old_logp_carry_no_gradient():
    logp0, teacher0, old0, mask = rand_batch(7)
    logp = logp0.clone().requires_grad_(True)
    teacher = teacher0.clone().requires_grad_(True)
    old = old0.clone().requires_grad_(True)
    for fn in (lambda: sd_reverse_kl_terms(logp, teacher, old), lambda: sdar_gated_terms(logp, teacher)):
        routed_sd_loss(fn(), mask, torch.ones(4, dtype=torch.bool)).backward()
    assert teacher.grad is None and old.grad is None


def test_self_teacher_sharing_weights_does_not_change_the_student_gradient():
    """Self-distillation: the teacher is the same weights under another context. Its log-probs
    computed WITH the graph must give the same student gradient as precomputed detached ones
    (the analogue of "perturbing the teacher context leaves logp.grad unchanged")."""
    z, _, _ = toy(8)
    context = torch.randn(V, dtype=F64)
    y = 3

    def grad(detach_teacher: bool) -> torch.Tensor:
        zz = z.clone().requires_grad_(True)
        logp = torch.log_softmax(zz, -1)[y]
        teacher = torch.log_softmax(zz + context, -1)[y]
        teacher = teacher.detach() if detach_teacher else teacher
        sd_reverse_kl_terms(logp, teacher, logp.detach()).backward()
        return zz.grad

    torch.testing.assert_close(grad(False), grad(True), atol=0, rtol=0)
    assert grad(False).abs().sum() > 0


# --- S7.SD.8: a teacher that prefers the sampled token raises its log-prob ---------------------


def test_sgd_step_raises_logp_when_teacher_prefers_the_token():
    z0, _, _ = toy(9)
    y = 2
    logp0 = torch.log_softmax(z0, -1)[y]
    for offset, sign in ((1.0, 1), (-1.0, -1)):  # teacher above (d < 0) / below (d > 0) the student
        z = z0.clone().requires_grad_(True)
        logp = torch.log_softmax(z, -1)[y]
        loss = sd_reverse_kl_terms(logp, logp0.detach() + offset, logp0.detach())
        loss.backward()
        with torch.no_grad():
            z -= 0.1 * z.grad
        change = torch.log_softmax(z.detach(), -1)[y] - logp0
        assert sign * change > 0


# --- S7.SD.9: denominators ---------------------------------------------------------------------


def test_denominator_counts_all_valid_tokens_of_the_mini_batch():
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=F64)  # 10 tokens
    match = T([True, False, False, True])  # 5 matched tokens
    ones = torch.ones_like(mask)
    assert sd_denominator(mask, match) == 10.0
    assert sd_denominator(mask, match, denominator="matched_tokens") == 5.0
    assert routed_sd_loss(ones, mask, match).item() == pytest.approx(5 / 10)
    assert routed_sd_loss(ones, mask, match, denominator="matched_tokens").item() == pytest.approx(1.0)
    w = T([1.0, 1.0, 0.0, 2.0], dtype=F64)  # weighted: 3 + 1 + 0 + 4 = 8; matched 3 + 4 = 7
    assert sd_denominator(mask, match, row_weights=w) == 8.0
    assert sd_denominator(mask, match, denominator="matched_tokens", row_weights=w) == 7.0
    # an all-unmatched batch with the matched-only denominator is 0, not nan
    assert (
        routed_sd_loss(ones, mask, torch.zeros(4, dtype=torch.bool), denominator="matched_tokens").item()
        == 0.0
    )


@pytest.mark.parametrize("denominator", ["all_tokens", "matched_tokens"])
def test_micro_batch_split_sums_to_the_full_batch_loss(denominator):
    logp, teacher, old, mask = rand_batch(10, b=6)
    match = T([True, False, True, True, False, True])
    per_token = sd_reverse_kl_terms(logp, teacher, old)
    full = routed_sd_loss(per_token, mask, match, denominator=denominator)
    den = sd_denominator(mask, match, denominator=denominator)
    parts = [
        routed_sd_loss(per_token[s], mask[s], match[s], denominator=denominator, global_denominator=den)
        for s in (slice(0, 1), slice(1, 4), slice(4, 6))
    ]
    torch.testing.assert_close(sum(parts), full)


def test_unknown_denominator_raises():
    with pytest.raises(ValueError):
        routed_sd_loss(torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1), denominator="rows")


# --- SDAR gated ablation -------------------------------------------------------------------------


def test_sdar_gradient_is_minus_gate_bounded_and_pushes_up():
    logp0, teacher, _, _ = rand_batch(11)
    logp = logp0.clone().requires_grad_(True)
    out = sdar_gated_terms(logp, teacher, beta=5.0)
    gate = torch.sigmoid(5.0 * (teacher - logp0))
    torch.testing.assert_close(out.detach(), gate * (teacher - logp0))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, -gate)
    assert (logp.grad < 0).all() and (logp.grad > -1).all()
    # tokens the teacher rejects get (almost) no push; tokens it endorses get (almost) -1
    lp = T([0.0, 0.0], dtype=F64, requires_grad=True)
    sdar_gated_terms(lp, T([-5.0, 5.0], dtype=F64)).sum().backward()
    assert abs(lp.grad[0]) < 1e-10 and lp.grad[1] == pytest.approx(-1.0, abs=1e-10)


def test_sdar_is_zero_valued_when_teacher_equals_student():
    logp0, _, _, _ = rand_batch(12)
    assert torch.equal(sdar_gated_terms(logp0, logp0.clone()), torch.zeros_like(logp0))


# --- lambda warm-down ---------------------------------------------------------------------------


def test_lambda_schedule():
    assert lambda_schedule(0, 100, lam=0.1, warm_down=False) == 0.1
    assert lambda_schedule(99, 100, lam=0.1, warm_down=False) == 0.1
    assert lambda_schedule(0, 100, lam=0.1, warm_down=True) == pytest.approx(0.1)
    assert lambda_schedule(25, 100, lam=0.1, warm_down=True) == pytest.approx(0.075)
    assert lambda_schedule(50, 100, lam=0.1, warm_down=True) == pytest.approx(0.05)
    assert lambda_schedule(100, 100, lam=0.1, warm_down=True) == 0.0
    assert lambda_schedule(150, 100, lam=0.1, warm_down=True) == 0.0
    values = [lambda_schedule(s, 10, lam=1.0, warm_down=True) for s in range(11)]
    assert all(a > b for a, b in itertools.pairwise(values))
    with pytest.raises(ValueError):
        lambda_schedule(0, 0, lam=0.1, warm_down=True)


# --- the ExtraLoss hook on collated micro-batches ----------------------------------------------


def full_setup(make_rows, seed=0):
    rows = make_rows(seed=seed)
    batch = collate_rows(rows, pad_token_id=0)
    n, length = batch.num_rows, batch.response_length
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, length, generator=gen) * 3
    old = logp + 0.1 * torch.randn(n, length, generator=gen)
    teacher = -torch.rand(n, length, generator=gen) * 3
    match = torch.rand(n, generator=gen) < 0.5
    match[0], match[1] = True, False
    return batch, logp, old, teacher, match


def view_of(batch, idx, logp_full, old_full, global_num_tokens, real=True, global_matched_tokens=0.0):
    micro = select_rows(batch, idx)
    cols = micro.response_length
    logp = logp_full[idx, :cols].clone().requires_grad_(True)
    view = MicroBatchView(
        micro,
        logp,
        old_full[idx, :cols],
        torch.zeros_like(logp),
        torch.ones(len(idx)) * float(real),
        global_num_tokens,
        global_matched_tokens,
    )
    return view, logp


def test_hook_matches_full_batch_loss_across_micro_batches(make_rows):
    batch, logp, old, teacher, match = full_setup(make_rows)
    mask = batch.response_mask
    hook = RoutedSDLoss(lam=0.1)
    assert hook.name == "sd"
    hook.set_teacher(teacher, match, step=0)
    n_tok = sd_denominator(mask, match)
    expected = 0.1 * routed_sd_loss(sd_reverse_kl_terms(logp, teacher, old), mask, match)
    order = torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(1))
    total = sum(hook(view_of(batch, idx, logp, old, n_tok)[0]) for idx in order.split(3))
    torch.testing.assert_close(total, expected)
    stats = hook.stats()
    assert stats["match_rate"] == pytest.approx(
        sd_denominator(mask, match, denominator="matched_tokens") / n_tok
    )
    d = (logp - teacher)[match]
    m = mask[match]
    assert stats["d_mean"] == pytest.approx(float((d * m).sum() / m.sum()), rel=1e-5)
    assert stats["k_mean"] > 0


def test_hook_padding_micro_batch_and_identity_teacher_are_zero(make_rows):
    batch, logp, old, _, match = full_setup(make_rows, seed=1)
    hook = RoutedSDLoss(lam=0.1)
    hook.set_teacher(logp.clone(), torch.ones_like(match))
    idx = torch.arange(4)
    view, leaf = view_of(batch, idx, logp, logp, 10.0)  # teacher == student == old
    out = hook(view)
    out.backward()
    assert out.item() == 0.0 and torch.equal(leaf.grad, torch.zeros_like(leaf))
    hook.set_teacher(logp - 1.0, torch.ones_like(match))
    view, leaf = view_of(batch, idx, logp, old, 10.0, real=False)  # padding micro-batch
    out = hook(view)
    out.backward()
    assert out.item() == 0.0 and torch.equal(leaf.grad, torch.zeros_like(leaf))


def test_hook_warm_down_sdar_and_matched_denominator(make_rows):
    batch, logp, old, teacher, match = full_setup(make_rows, seed=2)
    mask = batch.response_mask
    idx = torch.arange(batch.num_rows)
    n_tok = sd_denominator(mask, match)
    n_match = sd_denominator(mask, match, denominator="matched_tokens")
    base = routed_sd_loss(sdar_gated_terms(logp, teacher, beta=5.0), mask, match)
    hook = RoutedSDLoss(lam=0.2, form="sdar", warm_down=True, total_steps=4)
    hook.set_teacher(teacher, match, step=1)
    torch.testing.assert_close(hook(view_of(batch, idx, logp, old, n_tok)[0]), 0.15 * base)
    hook.set_teacher(teacher, match, step=4)
    assert hook(view_of(batch, idx, logp, old, n_tok)[0]).item() == 0.0
    matched_hook = RoutedSDLoss(lam=1.0, denominator="matched_tokens")
    matched_hook.set_teacher(teacher, match)
    torch.testing.assert_close(
        matched_hook(view_of(batch, idx, logp, old, n_tok, global_matched_tokens=n_match)[0]),
        routed_sd_loss(sd_reverse_kl_terms(logp, teacher, old), mask, match, denominator="matched_tokens"),
    )
    with pytest.raises(RuntimeError):
        RoutedSDLoss()(view_of(batch, idx, logp, old, n_tok)[0])
