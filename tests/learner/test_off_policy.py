"""Off-policy correction (docs/algorithms.md "Off-policy correction"): the behaviour weights, the
decoupled / TIS losses with hand-computed values, staleness, the config contract, and the learner
worker training with it on the tiny model (plain torch backend, one rank)."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from learner.actor import Denominators, StepData, actor_micro_loss
from learner.algos import (
    agg_loss,
    behaviour_weights,
    broadcast_advantages,
    geometric_mean_weights,
    kl_penalty,
    off_policy_policy_loss,
    ppo_policy_loss,
    staleness,
)
from learner.batch import collate_rows, rows_from_trajectories, select_rows
from learner.config import LearnerConfig
from learner.logprobs import ResponseScores
from learner.metrics import OldPass, Tally
from learner.off_policy import weight_band
from learner.types import TrainRow
from learner.worker import LearnerWorker

T = torch.tensor
CLIP = {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0}
LN = math.log


# --- behaviour weights ------------------------------------------------------------------------


def test_behaviour_weights_truncate_drop_and_mask():
    # w = exp(prox - behav) = [2, 1, 0.5, (padding)] ; cap C = 1.5
    prox = T([[LN(2.0), 0.0, LN(0.5), 5.0]])
    behav = torch.zeros(1, 4)
    mask = T([[1.0, 1.0, 1.0, 0.0]])
    tis = behaviour_weights(prox, behav, mask, method="tis", cap=1.5)
    torch.testing.assert_close(tis.raw, T([[2.0, 1.0, 0.5, 0.0]]))
    torch.testing.assert_close(tis.weight, T([[1.5, 1.0, 0.5, 0.0]]))  # min(w, C)
    assert tis.capped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    dec = behaviour_weights(prox, behav, mask, method="decoupled", cap=1.5)
    torch.testing.assert_close(dec.weight, T([[0.0, 1.0, 0.5, 0.0]]))  # w > C: the token is dropped
    assert dec.capped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    free = behaviour_weights(prox, behav, mask, method="decoupled", cap=None)
    torch.testing.assert_close(free.weight, T([[2.0, 1.0, 0.5, 0.0]]))
    assert free.capped.sum() == 0
    with pytest.raises(ValueError, match="cap must be > 1"):
        behaviour_weights(prox, behav, mask, method="tis", cap=1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        behaviour_weights(prox, behav, mask, method="none", cap=2.0)
    for method in ("seq_mask_tis", "icepop"):
        with pytest.raises(ValueError, match="needs a band"):
            behaviour_weights(prox, behav, mask, method=method, cap=2.0)
        with pytest.raises(ValueError, match="needs a band"):
            behaviour_weights(prox, behav, mask, method=method, cap=2.0, band=(1.1, 2.0))


def test_geometric_mean_weight_per_row():
    # row 0: w = [2, 1, 0.5] -> (2 * 1 * 0.5)^(1/3) = 1; row 1: w = [4, 1] -> sqrt(4) = 2 (padding
    # left out); row 2: no tokens -> 1
    log_w = T([[LN(2.0), 0.0, LN(0.5)], [LN(4.0), 0.0, 7.0], [3.0, 3.0, 3.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(geometric_mean_weights(log_w, mask), T([1.0, 2.0, 1.0]))


def test_behaviour_weights_are_detached():
    prox = torch.zeros(1, 2, requires_grad=True)
    w = behaviour_weights(prox, torch.zeros(1, 2), torch.ones(1, 2), method="tis", cap=2.0)
    assert not w.weight.requires_grad


# --- corrected losses, hand values ------------------------------------------------------------


def _two_rows():
    # rows: A = +1 (3 tokens), A = -0.5 (2 tokens + 1 pad); pi_theta = pi_prox at the update's start
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = broadcast_advantages(T([1.0, -0.5]), mask)
    prox = torch.full((2, 3), -1.0)
    # w = pi_prox / pi_behav = [[2, 1, 0.5], [4, 1, -]]  ->  behav = prox - ln w
    behav = prox - T([[LN(2.0), 0.0, LN(0.5)], [LN(4.0), 0.0, 0.0]])
    return mask, adv, prox, behav


@pytest.mark.parametrize(
    "method, expected_w",
    [
        ("tis", [[2.0, 1.0, 0.5], [3.0, 1.0, 0.0]]),  # min(4, C=3) = 3
        ("decoupled", [[2.0, 1.0, 0.5], [0.0, 1.0, 0.0]]),  # 4 > C=3: dropped
    ],
)
def test_corrected_loss_and_gradient_hand_values(method, expected_w):
    mask, adv, prox, behav = _two_rows()
    logp = prox.clone().requires_grad_(True)
    pl, w = off_policy_policy_loss(logp, prox, behav, adv, mask, method=method, cap=3.0, **CLIP)
    torch.testing.assert_close(w.weight, T(expected_w))
    # ratio pi_theta / pi_prox = 1 everywhere, so no clip is active and the per-token loss is -A * w:
    # tis:       row 0: -1*[2, 1, 0.5] = [-2, -1, -0.5]; row 1: +0.5*[3, 1] = [1.5, 0.5]
    #            token-mean over 5 tokens = (-3.5 + 2.0) / 5 = -0.3
    # decoupled: row 1 = +0.5*[0, 1] = [0, 0.5] -> (-3.5 + 0.5) / 5 = -0.6
    expected = {"tis": -0.3, "decoupled": -0.6}[method]
    loss = agg_loss(pl.loss, mask, "token-mean")
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    # d/dlogp (-A w rho) = -A w rho = -A w at rho = 1, divided by the 5 tokens
    torch.testing.assert_close(logp.grad, -adv * T(expected_w) / 5.0)
    assert pl.clipped.sum() == 0 and pl.approx_kl.abs().sum() == 0


@pytest.mark.parametrize(
    "method, band, expected_w, expected_capped, expected_loss",
    [
        # geometric means: row 0 (2 * 1 * 0.5)^(1/3) = 1, row 1 sqrt(4 * 1) = 2
        # band (0.5, 1.5): row 1 is dropped whole; row 0 kept (no weight above C = 3)
        #   loss = (-1 * (2 + 1 + 0.5) + 0) / 5 = -0.7
        ("seq_mask_tis", (0.5, 1.5), [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]], -0.7),
        # band (0.5, 2.5): both rows kept, then truncated at C = 3 like tis: min(4, 3) = 3
        #   loss = (-3.5 + 0.5 * (3 + 1)) / 5 = -0.3
        ("seq_mask_tis", (0.5, 2.5), [[2.0, 1.0, 0.5], [3.0, 1.0, 0.0]], [[0, 0, 0], [1, 0, 0]], -0.3),
        # icepop band (0.6, 3): 0.5 < 0.6 and 4 > 3 dropped, the kept 2 is NOT truncated (C unused)
        #   loss = (-1 * (2 + 1) + 0.5 * 1) / 5 = -0.5
        ("icepop", (0.6, 3.0), [[2.0, 1.0, 0.0], [0.0, 1.0, 0.0]], [[0, 0, 1], [1, 0, 0]], -0.5),
    ],
)
def test_masked_corrections_hand_values(method, band, expected_w, expected_capped, expected_loss):
    mask, adv, prox, behav = _two_rows()
    logp = prox.clone().requires_grad_(True)
    pl, w = off_policy_policy_loss(logp, prox, behav, adv, mask, method=method, cap=3.0, band=band, **CLIP)
    torch.testing.assert_close(w.weight, T(expected_w))
    torch.testing.assert_close(w.capped, T(expected_capped, dtype=torch.float32))
    torch.testing.assert_close(w.raw, T([[2.0, 1.0, 0.5], [4.0, 1.0, 0.0]]))
    loss = agg_loss(pl.loss, mask, "token-mean")  # a dropped token still counts in the 5 tokens
    assert loss.item() == pytest.approx(expected_loss)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv * T(expected_w) / 5.0)


def test_icepop_ignores_the_cap_and_seq_mask_tis_without_cap_keeps_w():
    mask, _, prox, behav = _two_rows()
    icepop = behaviour_weights(prox, behav, mask, method="icepop", cap=1.5, band=(0.25, 8.0))
    torch.testing.assert_close(icepop.weight, T([[2.0, 1.0, 0.5], [4.0, 1.0, 0.0]]))
    assert icepop.capped.sum() == 0
    seq = behaviour_weights(prox, behav, mask, method="seq_mask_tis", cap=None, band=(0.5, 2.0))
    torch.testing.assert_close(seq.weight, T([[2.0, 1.0, 0.5], [4.0, 1.0, 0.0]]))  # 2 <= high: kept


def test_trust_region_is_centred_on_the_proximal_policy():
    # one token, A = 1, pi_prox / pi_behav = 2, pi_theta / pi_prox = 1.1 (inside 1 +- 0.2)
    mask, adv = torch.ones(1, 1), torch.ones(1, 1)
    prox, behav = torch.zeros(1, 1), torch.full((1, 1), -LN(2.0))
    logp = torch.full((1, 1), LN(1.1), requires_grad=True)
    pl, _ = off_policy_policy_loss(logp, prox, behav, adv, mask, method="tis", cap=3.0, **CLIP)
    # decoupled / TIS: -w * rho = -2 * 1.1 = -2.2, not clipped, gradient -2.2
    assert pl.loss.item() == pytest.approx(-2.2)
    assert pl.clipped.item() == 0.0
    pl.loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-2.2)
    # plain PPO against the sampler instead: rho = 2.2 > 1.2 -> clipped at -1.2, no gradient
    logp2 = logp.detach().clone().requires_grad_(True)
    plain = ppo_policy_loss(logp2, behav, adv, mask, **CLIP)
    assert plain.loss.item() == pytest.approx(-1.2) and plain.clipped.item() == 1.0
    plain.loss.sum().backward()
    assert logp2.grad.item() == 0.0


def test_dual_clip_then_weight():
    # A = -2, pi_theta / pi_prox = 10 -> dual clip -A c = 6; then x w (w = 1.5 < C)
    mask = torch.ones(1, 1)
    prox, behav = torch.zeros(1, 1), torch.full((1, 1), -LN(1.5))
    pl, _ = off_policy_policy_loss(
        torch.full((1, 1), LN(10.0)), prox, behav, torch.full((1, 1), -2.0), mask,
        method="decoupled", cap=2.0, **CLIP,
    )  # fmt: skip
    assert pl.loss.item() == pytest.approx(6.0 * 1.5)
    assert pl.clipped_lower.item() == 1.0


@pytest.mark.parametrize(
    "method, band", [("tis", None), ("decoupled", None), ("seq_mask_tis", (0.999, 1.001)), ("icepop", (0.5, 5.0))]
)
def test_equal_to_plain_loss_when_behaviour_is_proximal(method, band):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).float()
    adv = broadcast_advantages(torch.randn(4, generator=gen), mask)
    prox = -torch.rand(4, 6, generator=gen) * 3
    a = (prox + 0.3 * torch.randn(4, 6, generator=gen)).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    plain = ppo_policy_loss(a, prox, adv, mask, **CLIP)
    corrected, w = off_policy_policy_loss(
        b, prox, prox.clone(), adv, mask, method=method, cap=2.0, band=band, **CLIP
    )
    assert torch.equal(w.weight, mask)  # w = exp(0) = 1 exactly on every token
    assert torch.equal(corrected.loss, plain.loss)
    agg_loss(plain.loss, mask, "token-mean").backward()
    agg_loss(corrected.loss, mask, "token-mean").backward()
    assert torch.equal(a.grad, b.grad)


# --- staleness ----------------------------------------------------------------------------------


def test_staleness_per_stamped_row_and_newer_rows_raise():
    assert staleness(T([3, 2, -1, 0]), 3).tolist() == [0, 1, 3]  # -1 = unstamped, left out
    assert staleness(T([-1, -1]), 5).numel() == 0
    with pytest.raises(ValueError, match="policy_version 4 but the learner is at version 3"):
        staleness(T([2, 4]), 3)


def test_rows_carry_the_trajectory_version_through_collate_and_select():
    from envs.types import TaskSpec
    from rollout_workers.types import Trajectory, Turn

    task = TaskSpec(env="alfworld", task_id="t0", task_type="pick", split="train", instruction="x", seed=1)
    turn = Turn(
        prompt_ids=(1, 2, 3), response_ids=(4, 5), sampler_logprobs=(-0.1, -0.2), response_text="ab",
        action="go", action_valid=True, observation="o", next_observation="o2",
    )  # fmt: skip
    trajs = [
        Trajectory(task=task, group_id="g", traj_id=f"t{v}", turns=(turn,) * (1 if v == 4 else 2),
                   success=True, score=1.0, policy_version=v, end_reason="won")
        for v in (4, 7)
    ]  # fmt: skip
    rows = rows_from_trajectories(trajs)
    assert [r.policy_version for r in rows] == [4, 7, 7]
    unstamped = rows[0].model_copy(update={"policy_version": None})
    batch = collate_rows([*rows, unstamped], pad_token_id=0)
    assert batch.policy_version.tolist() == [4, 7, 7, -1]
    assert select_rows(batch, T([3, 1])).policy_version.tolist() == [-1, 7]
    with pytest.raises(ValueError, match="policy_version must be >= 0"):
        TrainRow.model_validate({**rows[0].model_dump(), "policy_version": -2})


# --- config -------------------------------------------------------------------------------------


def test_config_contract():
    assert LearnerConfig().off_policy == "none" and LearnerConfig().tis_cap == 2.0
    assert LearnerConfig(off_policy="decoupled", tis_cap=None).tis_cap is None
    with pytest.raises(ValueError, match="tis_cap must be > 1"):
        LearnerConfig(off_policy="tis", tis_cap=0.9)
    with pytest.raises(ValueError, match="needs learner.old_logprobs=recompute"):
        LearnerConfig(off_policy="decoupled", old_logprobs="sampler")
    with pytest.raises(ValueError):
        LearnerConfig(off_policy="is")
    assert weight_band(LearnerConfig(off_policy="seq_mask_tis")) == (0.999, 1.001)
    assert weight_band(LearnerConfig(off_policy="icepop")) == (0.5, 5.0)
    assert weight_band(LearnerConfig(off_policy="tis")) is None
    with pytest.raises(ValueError, match="icepop_low / icepop_high must satisfy"):
        LearnerConfig(off_policy="icepop", icepop_low=1.2)
    with pytest.raises(ValueError, match="seq_mask_low / seq_mask_high must satisfy"):
        LearnerConfig(off_policy="seq_mask_tis", seq_mask_low=0.9, seq_mask_high=0.95)
    with pytest.raises(ValueError, match="seq_mask_low / seq_mask_high must satisfy"):
        LearnerConfig(seq_mask_low=0.0)


# --- the "none" path is the plain loss, untouched by the sampler's log-probs ---------------------


def test_none_path_is_the_plain_loss_whatever_the_sampler_says(make_rows):
    """actor_micro_loss with off_policy=none on a fixed batch and a fixed differentiable 'policy':
    loss and gradient equal the plain PPO + KL formula exactly, and changing the sampler's
    log-probs changes nothing (they only enter through off_policy)."""
    cfg = LearnerConfig(use_deepspeed=False, kl_coef=0.01)
    rows = make_rows()
    gen = torch.Generator().manual_seed(1)

    def run(rows_, off_policy: str):
        batch = collate_rows(rows_, pad_token_id=0)
        n, length = batch.num_rows, batch.response_length
        theta = (-torch.rand(n, length, generator=torch.Generator().manual_seed(2)) * 2).requires_grad_(True)
        old = OldPass(old_logp=theta.detach() - 0.05, ref_logp=theta.detach() + 0.1, entropy=None,
                      owned=torch.ones(n, dtype=torch.bool), recomputed=True)  # fmt: skip
        adv = torch.linspace(-1.0, 1.0, n)
        data = StepData(batch=batch, old=old, advantages=adv, weights=torch.ones(n))
        idx = torch.arange(n)
        den = Denominators(loss=float(batch.response_mask.sum()), num_tokens=float(batch.response_mask.sum()),
                           matched_tokens=0.0)  # fmt: skip

        def policy(micro, with_entropy):
            return ResponseScores(logp=theta[:, : micro.response_length], entropy=None)

        c = cfg.model_copy(update={"off_policy": off_policy})
        loss = actor_micro_loss(c, data, idx, True, den, Tally(), policy=policy, device=torch.device("cpu"),
                                extra_losses=())  # fmt: skip
        loss.backward()
        mask = batch.response_mask
        ref = ppo_policy_loss(theta, old.old_logp, broadcast_advantages(adv, mask), mask, **CLIP).loss
        kl = kl_penalty(theta, old.ref_logp, "k3")
        hand = agg_loss(ref, mask, "token-mean") + 0.01 * agg_loss(kl, mask, "token-mean")
        return loss.detach(), theta.grad.clone(), hand.detach()

    loss, grad, hand = run(rows, "none")
    assert loss.item() == pytest.approx(hand.item(), abs=1e-7)
    shifted = [r.model_copy(update={"sampler_logprobs": tuple(-3.0 - torch.rand(len(r.response_ids),
               generator=gen).numpy())}) for r in rows]  # fmt: skip
    loss2, grad2, _ = run(shifted, "none")
    assert torch.equal(loss, loss2) and torch.equal(grad, grad2)
    _, grad3, _ = run(shifted, "tis")  # the correction does see them
    assert not torch.equal(grad, grad3)


# --- the worker trains with it ------------------------------------------------------------------


def _cfg(**kw) -> LearnerConfig:
    base = {"lr": 1e-3, "use_deepspeed": False, "kl_coef": 0.0, "micro_batch_rows": 4, "seed": 3, "eps": 1.0}
    return LearnerConfig(**{**base, **kw})


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.backend.module.named_parameters()}


def test_version_stamps_do_not_change_the_default_update(tiny_model_dir, make_rows):
    """off_policy=none: stamped and unstamped rows train bit-identically; stamped rows add only the
    staleness metrics (0 in the synchronous loop)."""
    rows = make_rows()
    stamped = [r.model_copy(update={"policy_version": 0}) for r in rows]
    w_plain = LearnerWorker(_cfg(), str(tiny_model_dir))
    w_stamped = LearnerWorker(_cfg(), str(tiny_model_dir))
    m_plain, m_stamped = w_plain.train_step(rows), w_stamped.train_step(stamped)
    p_plain, p_stamped = _params(w_plain), _params(w_stamped)
    assert all(torch.equal(p_plain[k], p_stamped[k]) for k in p_plain)
    plain = {k: v for k, v in m_plain.extra_metrics.items() if not k.startswith("mismatch/")}
    stamped_extra = {k: v for k, v in m_stamped.extra_metrics.items() if not k.startswith("mismatch/")}
    assert m_plain.loss == m_stamped.loss and plain == {}
    assert stamped_extra == {"async/row_staleness_mean": 0.0, "async/row_staleness_max": 0.0}
    assert {k: v for k, v in m_plain.extra_metrics.items() if k.startswith("mismatch/")} == {
        k: v for k, v in m_stamped.extra_metrics.items() if k.startswith("mismatch/")}


@pytest.mark.parametrize(
    "method, bands",
    [
        ("decoupled", {}),
        ("tis", {}),
        ("seq_mask_tis", {"seq_mask_low": 0.991, "seq_mask_high": 1.01}),  # keeps 2 of 8 rows
        ("icepop", {"icepop_low": 0.99, "icepop_high": 1.01}),
    ],
)
def test_worker_trains_one_step_off_with_correction(tiny_model_dir, make_rows, method, bands):
    """Rows sampled by version 0 (their sampler log-probs are version 0's own), trained once at
    version 0 and again at version 1: staleness 0 then 1, the behaviour weights 1 then not, and the
    reported pg_loss equals the hand formula -TM(A * w) at the step's start."""
    cfg = _cfg(off_policy=method, tis_cap=1.01, lr=1e-2, **bands)
    w = LearnerWorker(cfg, str(tiny_model_dir))
    rows = make_rows()
    behav = w.score(rows)
    rows = [r.model_copy(update={"sampler_logprobs": tuple(lp), "policy_version": 0})
            for r, lp in zip(rows, behav)]  # fmt: skip
    m0 = w.train_step(rows)
    assert m0.extra_metrics["async/row_staleness_mean"] == 0.0
    assert m0.extra_metrics["async/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m0.extra_metrics["async/is_capped_frac"] == 0.0
    before = _params(w)
    prox = w.score(rows)  # version 1: the proximal policy of the next step
    m1 = w.train_step(rows)
    e = m1.extra_metrics
    assert e["async/row_staleness_mean"] == 1.0 and e["async/row_staleness_max"] == 1.0
    assert e["async/is_weight_max"] > 1.0 and 0.0 < e["async/is_capped_frac"] < 1.0
    assert any(not torch.equal(before[k], v) for k, v in _params(w).items())
    # hand value of the reported policy loss (one optimiser step, pi_theta = pi_prox at its start)
    batch = collate_rows(rows, pad_token_id=w._pad_id)
    mask = batch.response_mask
    pad = lambda lps: torch.stack([T(lp + [0.0] * (batch.response_length - len(lp))) for lp in lps])
    from learner.actor import row_advantages

    adv = broadcast_advantages(row_advantages(cfg, batch), mask)
    weights = behaviour_weights(pad(prox), pad(behav), mask, method=method, cap=1.01, band=weight_band(cfg))
    assert e["async/is_weight_mean"] == pytest.approx(float(weights.weight.sum() / mask.sum()), abs=1e-5)
    assert e["async/is_capped_frac"] == pytest.approx(float(weights.capped.sum() / mask.sum()), abs=1e-6)
    expected = agg_loss(-adv * weights.weight, mask, "token-mean").item()
    assert m1.pg_loss == pytest.approx(expected, abs=1e-5)


def test_rows_newer_than_the_learner_are_refused_before_training(tiny_model_dir, make_rows):
    w = LearnerWorker(_cfg(), str(tiny_model_dir))
    before = _params(w)
    rows = [r.model_copy(update={"policy_version": 2}) for r in make_rows()]
    with pytest.raises(ValueError, match="learner is at version 0"):
        w.train_step(rows)
    assert all(torch.equal(before[k], v) for k, v in _params(w).items()) and w.get_version() == 0


def _dp_rank_main(rank: int, model_dir: str, port: int, out_dir: str, rows_json: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    rows = [TrainRow.model_validate(r) for r in json.loads(rows_json)]
    cfg = _cfg(use_deepspeed=True, zero_stage=1, micro_batch_rows=2, off_policy="tis", tis_cap=1.5)
    w = LearnerWorker(cfg, model_dir, rank=rank, world_size=2, master_port=port)
    metrics = w.train_step(rows)
    w.export_weights(out_dir)
    if rank == 0:
        Path(out_dir, "metrics.json").write_text(metrics.model_dump_json())


@pytest.mark.deepspeed
@pytest.mark.slow
def test_two_ranks_match_one_rank_with_correction(tiny_model_dir, make_rows, free_port, tmp_path):
    """The corrected update and its metrics do not depend on the data-parallel split: the weight
    sums are summed and the raw maximum is max-reduced over ranks (odd row count: uneven ranks)."""
    from safetensors.torch import load_file

    rows = make_rows()[:11]
    exact = LearnerWorker(_cfg(), str(tiny_model_dir)).score(rows)
    gen = torch.Generator().manual_seed(1)  # seed 1: the largest weight lies in rank 1's rows
    rows = [
        r.model_copy(update={"policy_version": 0, "sampler_logprobs": tuple(
            (T(lp) - (torch.rand(len(lp), generator=gen) * 1.2 - 0.6)).tolist())})  # w = exp(U(-0.6, 0.6))
        for r, lp in zip(rows, exact)
    ]  # fmt: skip
    rows_json = json.dumps([r.model_dump() for r in rows])
    out, port = tmp_path / "dp2", free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dp_rank_main, args=(r, str(tiny_model_dir), port, str(out), rows_json))
             for r in (0, 1)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0]
    single = LearnerWorker(_cfg(off_policy="tis", tis_cap=1.5, micro_batch_rows=2), str(tiny_model_dir))
    m_single = single.train_step(rows)
    got = load_file(str(out / "model.safetensors"))
    for k, v in single.backend.module.state_dict().items():
        if k in got:
            torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0, msg=k)
    e_dp, e_single = json.loads((out / "metrics.json").read_text())["extra_metrics"], m_single.extra_metrics
    assert 0.0 < e_single["async/is_capped_frac"] < 1.0 and e_single["async/is_weight_max"] > 1.5
    assert e_dp.keys() == e_single.keys()
    for key, value in e_single.items():
        assert e_dp[key] == pytest.approx(value, abs=1e-5), key
