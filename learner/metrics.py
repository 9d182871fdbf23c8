"""Bookkeeping for `LearnerWorker.train_step`: stage timing, per-rank sums, the StepMetrics, and
the text health metric of the trained responses (`envs.health.repeated_ngram_ratio`)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from envs.health import repeated_ngram_ratio
from learner.algos import kl_penalty
from learner.mismatch import mismatch_abs_max, mismatch_sums
from learner.types import StageSeconds, StepMetrics, TokenBatch


@dataclass(frozen=True)
class OldPass:
    """The no-grad pass at step start; rows of this rank are filled (others stay 0)."""

    old_logp: torch.Tensor  # (N, L_r) theta_old
    ref_logp: torch.Tensor | None  # (N, L_r) reference policy; None when kl_coef == 0
    entropy: torch.Tensor | None  # (N, L_r) entropy of theta_old; None = not measured here
    owned: torch.Tensor  # (N,) bool: rows this rank scored and trains on
    recomputed: bool = False  # this pass forwarded the policy (else the first update pass measures)

    def sums(self, batch: TokenBatch, *, kl_type: str) -> dict[str, float]:
        """Sums over this rank's rows: KL to the reference, entropy, |learner - sampler| (token
        sums), and the responses' repeated 4-gram ratios (a row sum: the text health metric)."""
        owned_mask = batch.response_mask * self.owned[:, None].float()
        kl = 0.0
        if self.ref_logp is not None:
            kl = float((kl_penalty(self.old_logp, self.ref_logp, kl_type) * owned_mask).sum())
        rows = torch.nonzero(self.owned).squeeze(-1).tolist()
        lengths = batch.response_mask.sum(-1).long()
        rep4 = sum(repeated_ngram_ratio(batch.responses[i, : int(lengths[i])].tolist(), n=4) for i in rows)
        sums = {"owned_tokens": float(owned_mask.sum()), "kl_sum": kl, "rep4_sum": float(rep4),
                "rep4_rows": float(len(rows))}
        if self.recomputed:  # else the first update pass tallies both
            sums["sampler_diff_sum"] = float(((self.old_logp - batch.sampler_logp).abs() * owned_mask).sum())
            if self.entropy is not None:  # None: learner.log_entropy is off
                sums["entropy_sum"] = float((self.entropy * owned_mask).sum())
        return sums


@dataclass
class Tally:
    """Sums over this rank's micro-batches (reduced over ranks once, at the end of the step)."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    grad_norms: list[float] = field(default_factory=list)
    mismatch_max: float = 0.0
    """max |log p_engine - log p_learner| over the tokens `add_mismatch` saw."""

    def add(self, name: str, value: torch.Tensor | float) -> None:
        self.sums[name] += float(value)

    def add_mismatch(self, engine_logp: torch.Tensor, learner_logp: torch.Tensor, mask: torch.Tensor) -> None:
        """Engine-vs-learner log-prob sums (`learner.mismatch`) of the tokens where `mask` > 0."""
        for name, value in mismatch_sums(engine_logp, learner_logp, mask).items():
            self.add(name, value)
        self.mismatch_max = max(self.mismatch_max, mismatch_abs_max(engine_logp, learner_logp, mask))


class StageClock:
    """`with clock("collate_s"): ...` records the seconds of each named stage."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - t0

    def stages(self) -> StageSeconds:
        return StageSeconds(**self.seconds, total_s=time.perf_counter() - self.start)


def step_metrics(
    batch: TokenBatch,
    sums: dict[str, float],
    *,
    grad_norms: list[float],
    scores: torch.Tensor,
    advantages: torch.Tensor,
    lr: float,
    policy_version: int,
    seconds: StageSeconds,
    extra_metrics: dict[str, float] | None = None,
) -> StepMetrics:
    """StepMetrics from rank-summed `sums` (Tally sums + OldPass sums): loss terms are the mean
    over optimiser steps, token metrics global token-means."""
    steps = max(len(grad_norms), 1)
    tokens, owned_tokens = max(sums["update_tokens"], 1.0), max(sums["owned_tokens"], 1.0)
    lengths = batch.response_mask.sum(-1).long()
    return StepMetrics(
        policy_version=policy_version,
        loss=sums["loss"] / steps,
        pg_loss=sums["pg_loss"] / steps,
        kl_loss=sums["kl_loss"] / steps,
        entropy_loss=sums["entropy_loss"] / steps,
        extra_losses={k.removeprefix("extra/"): v / steps for k, v in sums.items() if k.startswith("extra/")},
        pg_clipfrac=sums["clipped"] / tokens,
        pg_clipfrac_lower=sums["clipped_lower"] / tokens,
        ppo_kl=sums["approx_kl"] / tokens,
        kl=sums["kl_sum"] / owned_tokens,
        entropy=sums["entropy_sum"] / owned_tokens if "entropy_sum" in sums else float("nan"),
        grad_norm=sum(grad_norms) / steps,
        lr=lr,
        num_rows=batch.num_rows,
        num_tokens=int(lengths.sum()),
        num_optimizer_steps=len(grad_norms),
        score_mean=float(scores.mean()),
        advantage_abs_mean=float(advantages.abs().mean()),
        response_length_mean=float(lengths.float().mean()),
        rep4gram_ratio=sums["rep4_sum"] / max(sums["rep4_rows"], 1.0),
        sampler_logp_abs_diff=sums["sampler_diff_sum"] / owned_tokens,
        seconds=seconds,
        extra_metrics=dict(extra_metrics or {}),
    )
