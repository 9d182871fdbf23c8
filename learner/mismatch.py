"""Training-inference mismatch of one step: how far the engine's log-probs of the tokens it sampled
are from the learner's log-probs of the same tokens (what verl and slime log every step).

Over the step's response tokens, with x = log p_engine and y = log p_learner:
- `mismatch/logp_abs_diff_mean` and `mismatch/logp_abs_diff_max`: mean and max of |x - y|;
- `mismatch/logp_pearson`: Pearson's correlation of x and y;
- `mismatch/kl_k3`: the k3 estimate of KL(engine || learner) from the engine's own samples,
  mean of r - 1 - log r with r = p_learner / p_engine = exp(y - x) (non-negative per token).

Two steps, so data-parallel ranks can add their parts first: `mismatch_sums` gives token sums
(summed over ranks as they are) and `mismatch_abs_max` a maximum (reduced with max), then
`mismatch_metrics` turns them into the four numbers. A number that is undefined (no token; a
constant sequence for the correlation) is left out, so metrics.jsonl stays strict JSON.
"""

from __future__ import annotations

import math

import torch

PREFIX = "mismatch/"
_SUMS = ("tokens", "abs_diff", "x", "y", "xx", "yy", "xy", "k3")


ZERO_SUMS: dict[str, float] = {f"{PREFIX}sum_{name}": 0.0 for name in _SUMS}
"""`mismatch_sums` of no token: every rank holds the same keys before the sums are all-reduced."""


def _masked(engine_logp: torch.Tensor, learner_logp: torch.Tensor, mask: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    keep = mask.reshape(-1) > 0
    return engine_logp.reshape(-1)[keep].double(), learner_logp.reshape(-1)[keep].double()


def mismatch_sums(engine_logp: torch.Tensor, learner_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Token sums (keys `mismatch/sum_*`) over the positions where `mask` > 0; all three tensors
    have the same shape."""
    x, y = _masked(engine_logp, learner_logp, mask)
    d = y - x
    values = (x.numel(), d.abs().sum(), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum(),
              (torch.expm1(d) - d).sum())
    return {f"{PREFIX}sum_{name}": float(v) for name, v in zip(_SUMS, values, strict=True)}


def mismatch_abs_max(engine_logp: torch.Tensor, learner_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """max |log p_engine - log p_learner| where `mask` > 0 (0 without any such position)."""
    x, y = _masked(engine_logp, learner_logp, mask)
    return float((y - x).abs().max()) if x.numel() else 0.0


def _pearson(n: float, s: dict[str, float]) -> float | None:
    cov = s["xy"] - s["x"] * s["y"] / n
    var_x, var_y = s["xx"] - s["x"] ** 2 / n, s["yy"] - s["y"] ** 2 / n
    if var_x <= 0 or var_y <= 0:
        return None
    return max(-1.0, min(1.0, cov / math.sqrt(var_x * var_y)))


def mismatch_metrics(sums: dict[str, float], abs_max: float) -> dict[str, float]:
    """The step's `mismatch/*` metrics from (rank-summed) `mismatch_sums` and the (rank-max)
    `mismatch_abs_max`; {} when no token was counted."""
    s = {name: sums[f"{PREFIX}sum_{name}"] for name in _SUMS}
    n = s["tokens"]
    if n <= 0:
        return {}
    out = {f"{PREFIX}logp_abs_diff_mean": s["abs_diff"] / n, f"{PREFIX}logp_abs_diff_max": abs_max,
           f"{PREFIX}kl_k3": s["k3"] / n}
    pearson = _pearson(n, s)
    if pearson is not None:
        out[f"{PREFIX}logp_pearson"] = pearson
    return out


def mismatch(engine_logp: torch.Tensor, learner_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """`mismatch_metrics` of one process's tensors (no ranks to combine)."""
    return mismatch_metrics(mismatch_sums(engine_logp, learner_logp, mask),
                            mismatch_abs_max(engine_logp, learner_logp, mask))
