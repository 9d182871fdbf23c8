"""Percentile-bootstrap confidence intervals (docs/algorithms.md e: resample states with replacement,
B = 10,000, 2.5/97.5 percentiles; differences between variants on the same states are paired)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_CHUNK = 1000  # bootstrap replicates per chunk (bounds memory at _CHUNK x n indices)


def _boot_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty(n_boot)
    for start in range(0, n_boot, _CHUNK):
        stop = min(start + _CHUNK, n_boot)
        out[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    return out


def _interval(point: float, boots: np.ndarray, alpha: float) -> tuple[float, float, float]:
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return float(point), float(lo), float(hi)


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap values must be finite")
    return x


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 10_000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, lo, hi): the sample mean and its percentile-bootstrap (1 - alpha) interval.
    Empty input gives (nan, nan, nan); one value gives a zero-width interval."""
    x = _as_array(values)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    return _interval(x.mean(), _boot_means(x, n_boot, np.random.default_rng(seed)), alpha)


def paired_bootstrap_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, n_boot: int = 10_000,
                        seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """mean(a - b) with a CI from resampling the PAIRS (a_i, b_i) together (same states)."""
    x, y = _as_array(a), _as_array(b)
    if x.shape != y.shape:
        raise ValueError(f"paired bootstrap needs equal lengths, got {x.size} and {y.size}")
    return bootstrap_ci(x - y, n_boot=n_boot, seed=seed, alpha=alpha)


def unpaired_bootstrap_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, n_boot: int = 10_000,
                          seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """mean(a) - mean(b) for two independent samples (different states): each resampled on its own."""
    x, y = _as_array(a), _as_array(b)
    if x.size == 0 or y.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boots = _boot_means(x, n_boot, rng) - _boot_means(y, n_boot, rng)
    return _interval(x.mean() - y.mean(), boots, alpha)
