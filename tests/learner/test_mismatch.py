"""learner.mismatch: the per-step engine-vs-learner log-prob metrics, against values computed by hand."""

import math

import pytest
import torch

from learner.mismatch import mismatch, mismatch_abs_max, mismatch_metrics, mismatch_sums

# engine x, learner y; the 4th position is padding (masked out) and holds values that would show
ENGINE = torch.tensor([[-1.0, -2.0, -3.0, -50.0]])
LEARNER = torch.tensor([[-1.5, -2.0, -2.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_hand_computed_values():
    # d = y - x = (-0.5, 0, 1)
    got = mismatch(ENGINE, LEARNER, MASK)
    assert got["mismatch/logp_abs_diff_mean"] == pytest.approx(0.5)
    assert got["mismatch/logp_abs_diff_max"] == pytest.approx(1.0)
    # k3 = e^d - 1 - d per token: (e^-0.5 - 0.5, 0, e - 2), averaged over 3 tokens
    assert got["mismatch/kl_k3"] == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2) / 3)
    # centred x = (1, 0, -1), centred y = (1/3, -1/6, -1/6): cov 1/2, var 2 and 1/6 -> sqrt(3)/2
    assert got["mismatch/logp_pearson"] == pytest.approx(math.sqrt(3) / 2)
    assert set(got) == {"mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max", "mismatch/kl_k3",
                        "mismatch/logp_pearson"}


def test_sums_of_two_ranks_give_the_metrics_of_the_whole():
    first, second = MASK.clone(), MASK.clone()
    first[0, 1:] = 0
    second[0, 0] = 0
    parts = [mismatch_sums(ENGINE, LEARNER, m) for m in (first, second)]
    summed = {k: parts[0][k] + parts[1][k] for k in parts[0]}
    top = max(mismatch_abs_max(ENGINE, LEARNER, m) for m in (first, second))
    assert mismatch_metrics(summed, top) == pytest.approx(mismatch(ENGINE, LEARNER, MASK))


def test_equal_logprobs_give_zero_gap_and_full_correlation():
    got = mismatch(ENGINE, ENGINE, MASK)
    assert got["mismatch/logp_abs_diff_mean"] == 0 and got["mismatch/logp_abs_diff_max"] == 0
    assert got["mismatch/kl_k3"] == 0 and got["mismatch/logp_pearson"] == pytest.approx(1.0)


def test_undefined_numbers_are_left_out():
    assert mismatch(ENGINE, LEARNER, torch.zeros_like(MASK)) == {}
    flat = torch.full_like(ENGINE, -2.0)  # no variance: no correlation
    assert "mismatch/logp_pearson" not in mismatch(flat, LEARNER, MASK)
    assert mismatch_abs_max(ENGINE, LEARNER, torch.zeros_like(MASK)) == 0.0


@pytest.mark.parametrize("old_logprobs", ["recompute", "sampler"])
def test_every_training_step_reports_the_mismatch(tiny_model_dir, make_rows, old_logprobs):
    """A training step's `mismatch/*` metrics describe the same tokens as its |learner - sampler|
    figure, in both places the learner's log-probs of theta_old exist (the no-grad pass, or the
    first update pass when pi_old is the sampler's)."""
    from learner.config import LearnerConfig
    from learner.worker import LearnerWorker

    rows = [r.model_copy(update={"sampler_logprobs": tuple(-0.5 - 0.1 * j for j in range(len(r.response_ids)))})
            for r in make_rows()]  # varied, so the correlation is defined
    cfg = LearnerConfig(lr=1e-3, use_deepspeed=False, kl_coef=0.0, micro_batch_rows=4, seed=3,
                        old_logprobs=old_logprobs)
    m = LearnerWorker(cfg, str(tiny_model_dir)).train_step(rows)
    e = m.extra_metrics
    assert e["mismatch/logp_abs_diff_mean"] == pytest.approx(m.sampler_logp_abs_diff, rel=1e-5)
    assert e["mismatch/logp_abs_diff_mean"] > 0  # make_rows' sampler log-probs are not the model's
    assert e["mismatch/logp_abs_diff_max"] >= e["mismatch/logp_abs_diff_mean"]
    assert e["mismatch/kl_k3"] >= 0 and -1.0 <= e["mismatch/logp_pearson"] <= 1.0
