"""SMRC-SD routed self-distillation as pure torch functions (docs/algorithms.md c, S2).

Conventions as in `learner.algos`: B rows (one row = one environment turn), L response positions,
`mask` the (B, L) response mask, `match` the (B,) routing flag M_i. Teacher and theta_old
log-probs are per sampled token, (B, L), and always detached here (docs/algorithms.md c, pitfall 4).

- `sd_reverse_kl_terms`: Skill-SD's per-token w * k3, whose gradient is w * (logp - teacher) *
  grad logp: the importance-weighted sampled-token reverse-KL gradient (pitfalls 1-3: dropping w
  gives the forward-KL gradient, the raw log-ratio has zero expected gradient).
- `sdar_gated_terms`: SDAR's gated ablation g * (teacher - logp), gradient -g * grad logp.
- `routed_sd_loss`: sum(w_i m M_i l) / D with D all valid tokens of the mini-batch (default) or
  the matched ones.
- `lambda_schedule`: lambda_SD, optionally warmed down linearly to 0.
- `RoutedSDLoss`: the learner's `ExtraLoss` hook (name "sd").
"""

from __future__ import annotations

from typing import Literal

import torch

from learner.types import MicroBatchView

RATIO_CLAMP = 10.0
NEG_CLAMP = 20.0
Denominator = Literal["all_tokens", "matched_tokens"]
_DENOMINATORS = ("all_tokens", "matched_tokens")


# ---------------------------------------------------------------------------------------------
# per-token terms


def sd_reverse_kl_terms(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    old_logp: torch.Tensor,
    *,
    ratio_clamp: float = RATIO_CLAMP,
    neg_clamp: float = NEG_CLAMP,
) -> torch.Tensor:
    """Skill-SD per-token loss l = w * k: (B, L) x 3 -> (B, L).

    d = logp - teacher_logp, k = exp(min(-d, neg_clamp)) - 1 + d (k3 >= 0, = 0 iff d = 0),
    w = exp(min(logp - old_logp, ratio_clamp)), whose own gradient counts. teacher_logp and
    old_logp are detached. Unclamped, grad l = w * d * grad logp (the reverse-KL policy gradient, off-policy
    corrected by w); it is exactly 0 (value and gradient) when logp == teacher_logp.
    Padding positions are not masked here (see `routed_sd_loss`).

    The gradient is applied in closed form (straight-through: value w * k, gradient g * grad
    logp): autograd through w * k cancels two terms of size e^{-d} and, in float32, loses O(1)
    of the gradient once d < -15; below d = -neg_clamp the clamp would even leave w's own
    gradient carrying e^neg_clamp (~ +4.9e8 instead of d). g = w * d for every d, except where
    the ratio clamp holds w constant: there g = w * dk/dlogp = w * (1 - e^{-d}) as long as
    e^{-d} is unclamped, and w * d below -neg_clamp.
    """
    d = (logp - teacher_logp.detach()).detach()
    log_ratio = (logp - old_logp.detach()).detach()
    w = torch.exp(log_ratio.clamp(max=ratio_clamp))
    k = torch.exp((-d).clamp(max=neg_clamp)) - 1.0 + d
    ratio_clamped = (log_ratio > ratio_clamp) & (d >= -neg_clamp)
    grad = torch.where(ratio_clamped, w * (1.0 - torch.exp((-d).clamp(max=neg_clamp))), w * d)
    return w * k + grad * (logp - logp.detach())


def sdar_gated_terms(logp: torch.Tensor, teacher_logp: torch.Tensor, *, beta: float = 5.0) -> torch.Tensor:
    """SDAR's gated per-token loss g * (teacher_logp - logp): (B, L) x 2 -> (B, L).

    delta = teacher_logp - logp and g = sigmoid(beta * delta) are detached, so grad l =
    -g * grad logp with g in (0, 1): every sampled token is pushed up, by at most 1, and tokens
    the teacher rejects (delta << 0) barely. The teacher is detached.
    """
    teacher = teacher_logp.detach()
    gate = torch.sigmoid(beta * (teacher - logp.detach()))
    return gate * (teacher - logp)


# ---------------------------------------------------------------------------------------------
# aggregation


def _weights(
    mask: torch.Tensor, match: torch.Tensor, row_weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid token weights, matched token weights), both (B, L)."""
    valid = mask.float()
    if row_weights is not None:
        valid = valid * row_weights.to(valid)[:, None]
    return valid, valid * match.to(valid)[:, None]


def sd_denominator(
    mask: torch.Tensor,
    match: torch.Tensor,
    *,
    denominator: Denominator = "all_tokens",
    row_weights: torch.Tensor | None = None,
) -> float:
    """D of `routed_sd_loss` over a whole mini-batch: (B, L) mask, (B,) match [, (B,) row weights].

    all_tokens: sum_i w_i * valid tokens of row i (= the worker's `global_num_tokens`);
    matched_tokens: the same over matched rows only. Compute it once over every row of the
    mini-batch on every rank and pass it to each micro-batch's `routed_sd_loss`.
    """
    if denominator not in _DENOMINATORS:
        raise ValueError(f"unknown SD denominator {denominator!r}; known: {_DENOMINATORS}")
    valid, matched = _weights(mask, match, row_weights)
    return float((valid if denominator == "all_tokens" else matched).sum())


def routed_sd_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    match: torch.Tensor,
    *,
    denominator: Denominator = "all_tokens",
    global_denominator: float | None = None,
    row_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_SD = sum_{i,t} w_i m_{i,t} M_i l_{i,t} / D -> scalar.

    per_token (B, L) (e.g. `sd_reverse_kl_terms`); mask (B, L) {0,1}; match (B,) bool or {0,1};
    row_weights (B,) optional (0 for padding rows). D = `global_denominator` when given (the
    mini-batch value, so micro-batch / rank splits sum to the full loss), else this batch's own
    `sd_denominator(..., denominator=denominator)`. With "all_tokens" the SD term scales with
    the match rate (S2); an all-unmatched batch gives exactly 0 loss and 0 gradient. Positions
    outside the mask or on unmatched rows are zeroed by `where`, so non-finite values there
    cannot leak into the value.
    """
    if denominator not in _DENOMINATORS:
        raise ValueError(f"unknown SD denominator {denominator!r}; known: {_DENOMINATORS}")
    valid, matched = _weights(mask, match, row_weights)
    if global_denominator is None:
        global_denominator = float((valid if denominator == "all_tokens" else matched).sum())
    values = torch.where(matched != 0, per_token, torch.zeros_like(per_token))
    return (matched * values).sum() / max(global_denominator, 1e-12)


# ---------------------------------------------------------------------------------------------
# coefficient


def lambda_schedule(step: int, total_steps: int, *, lam: float, warm_down: bool) -> float:
    """lambda_SD at optimiser/train step `step` (0-based) of `total_steps`.

    warm_down=False: constant `lam`. warm_down=True: lam * (1 - step / total_steps), linear from
    lam at step 0 to 0 at step >= total_steps (clamped; never negative).
    """
    if not warm_down:
        return float(lam)
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0 for a warm-down, got {total_steps}")
    return float(lam) * max(0.0, 1.0 - step / total_steps)


# ---------------------------------------------------------------------------------------------
# the learner hook


class RoutedSDLoss:
    """`ExtraLoss` (name "sd") adding lambda_SD * L_SD to the GRPO loss of each micro-batch.

    Per train step, call `set_teacher(teacher_logp, match, step=...)` with tensors aligned with
    the rows given to `train_step` (teacher_logp (N, L_r) float, right-padded like the
    responses; match (N,) bool). The hook picks its micro-batch's rows with
    `view.batch.row_index` and its columns with `[:, :L_m]` (micro-batches are trimmed).

    form: "rkl" (Skill-SD w * k3, default) or "sdar" (gated ablation, `beta`).
    denominator: "all_tokens" uses `view.global_num_tokens` (the mini-batch's weighted valid
    tokens on all ranks), "matched_tokens" `view.global_matched_tokens` (the same over the rows
    with a teacher prompt).
    `total_steps` + `warm_down` give the linear warm-down of `lam` over train steps.

    `stats()` returns token-weighted diagnostics accumulated since the last `set_teacher`:
    match_rate (matched / valid tokens seen), d_mean and k_mean (k3, unweighted) on matched tokens.
    """

    name = "sd"

    def __init__(
        self,
        *,
        lam: float = 0.1,
        form: Literal["rkl", "sdar"] = "rkl",
        denominator: Denominator = "all_tokens",
        ratio_clamp: float = RATIO_CLAMP,
        neg_clamp: float = NEG_CLAMP,
        beta: float = 5.0,
        warm_down: bool = False,
        total_steps: int = 0,
    ) -> None:
        if form not in ("rkl", "sdar"):
            raise ValueError(f"unknown SD form {form!r}; known: ('rkl', 'sdar')")
        if denominator not in _DENOMINATORS:
            raise ValueError(f"unknown SD denominator {denominator!r}; known: {_DENOMINATORS}")
        if warm_down and total_steps <= 0:
            raise ValueError("warm_down needs total_steps > 0")
        self.lam, self.form, self.denominator = lam, form, denominator
        self.ratio_clamp, self.neg_clamp, self.beta = ratio_clamp, neg_clamp, beta
        self.warm_down, self.total_steps = warm_down, total_steps
        self.teacher_logp: torch.Tensor | None = None
        self.match: torch.Tensor | None = None
        self.step = 0
        self._sums = dict.fromkeys(("valid", "matched", "d", "k"), 0.0)

    def set_teacher(self, teacher_logp: torch.Tensor, match: torch.Tensor, *, step: int = 0) -> None:
        """Teacher log-probs (N, L_r) and match flags (N,) of this train step's rows; resets stats."""
        if teacher_logp.dim() != 2 or match.dim() != 1 or match.shape[0] != teacher_logp.shape[0]:
            raise ValueError(
                f"need teacher_logp (N, L_r) and match (N,), got {tuple(teacher_logp.shape)}, {tuple(match.shape)}"
            )
        self.teacher_logp = teacher_logp.detach()
        self.match = match.detach().bool()
        self.step = step
        self._sums = dict.fromkeys(self._sums, 0.0)

    @property
    def coefficient(self) -> float:
        return lambda_schedule(self.step, max(self.total_steps, 1), lam=self.lam, warm_down=self.warm_down)

    def __call__(self, view: MicroBatchView) -> torch.Tensor:
        if self.teacher_logp is None or self.match is None:
            raise RuntimeError("RoutedSDLoss called before set_teacher()")
        logp = view.logp
        rows = view.batch.row_index.to(self.teacher_logp.device)
        cols = logp.shape[1]
        teacher = self.teacher_logp[rows, :cols].to(logp)
        match = self.match[rows].to(logp.device)
        mask = view.batch.response_mask.to(logp)
        if self.form == "rkl":
            per_token = sd_reverse_kl_terms(
                logp, teacher, view.old_logp, ratio_clamp=self.ratio_clamp, neg_clamp=self.neg_clamp
            )
        else:
            per_token = sdar_gated_terms(logp, teacher, beta=self.beta)
        den = view.global_num_tokens if self.denominator == "all_tokens" else view.global_matched_tokens
        loss = routed_sd_loss(
            per_token, mask, match, denominator=self.denominator, global_denominator=den,
            row_weights=view.row_weights,
        )  # fmt: skip
        self._tally(logp.detach() - teacher, mask, match, view.row_weights)
        return self.coefficient * loss

    def _tally(self, d, mask, match, row_weights) -> None:
        valid, matched = _weights(mask, match, row_weights)
        k = torch.exp((-d).clamp(max=self.neg_clamp)) - 1.0 + d
        keep = matched != 0
        self._sums["valid"] += float(valid.sum())
        self._sums["matched"] += float(matched.sum())
        self._sums["d"] += float(torch.where(keep, d * matched, torch.zeros_like(d)).sum())
        self._sums["k"] += float(torch.where(keep, k * matched, torch.zeros_like(d)).sum())

    def sums(self) -> dict[str, float]:
        """The raw weighted token sums behind `stats()` (valid, matched, d, k) since the last
        `set_teacher`, for reducing over ranks before dividing."""
        return dict(self._sums)

    def stats(self) -> dict[str, float]:
        s, matched = self._sums, max(self._sums["matched"], 1e-12)
        return {
            "match_rate": s["matched"] / max(s["valid"], 1e-12),
            "d_mean": s["d"] / matched,
            "k_mean": s["k"] / matched,
        }
