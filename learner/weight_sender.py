"""The learner's side of collective weight sync (`sync.method: broadcast`; protocol in weightsync/).

Only rank 0 is a member of the weight-sync group; under ZeRO-3 every rank still runs the same
module-by-module stream, because each module's parameters are gathered with
`deepspeed.zero.GatheredParameters` (a collective of the learner ranks) just long enough to copy
them into a bucket. No rank ever holds the whole model and nothing is written to disk. With LoRA
the same stream carries the adapter tensors alone, or the merged weights (`learner.lora`).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from learner.config import LearnerConfig
from learner.lora import adapter_stream, merged_stream
from weightsync.group import GroupSpec, WeightGroup
from weightsync.protocol import SyncStats, dtype_of, release_cached_memory, send_weights
from weightsync.stream import parameter_stream

SyncContent = Literal["full", "adapter", "merged"]
STREAMS = {"full": parameter_stream, "adapter": adapter_stream, "merged": merged_stream}
"""What a sync sends -> the (header entries, tensor stream) of the model."""


def _zero3_gather(cfg: LearnerConfig):
    """deepspeed's GatheredParameters under ZeRO-3, None otherwise (parameters are whole)."""
    if not (cfg.use_deepspeed and cfg.zero_stage == 3):
        return None
    import deepspeed  # `deepspeed.zero` is an attribute, not an importable module

    return lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def _finish_gathers(stream) -> None:
    """Run the rest of the stream without sending, so that the other learner ranks' ZeRO-3
    gathers stay matched when rank 0 stops early."""
    with contextlib.suppress(Exception):
        for _ in stream:
            pass


class WeightSender:
    """Rank 0's membership of the weight-sync group plus the stream every rank runs."""

    def __init__(self, cfg: LearnerConfig, rank: int):
        self._cfg, self._rank = cfg, rank
        self._group: WeightGroup | None = None

    def join(self, spec: GroupSpec, device: torch.device) -> None:
        """Rank 0 joins as weight-sync rank 0 (blocks until every engine joined); replaces an
        earlier group. Other learner ranks are not members."""
        if self._rank != 0:
            raise ValueError(f"learner rank {self._rank} is not a member of the weight-sync group; only rank 0 is")
        self.close()
        self._group = WeightGroup(spec, 0, device=device if device.type == "cuda" else None)

    @torch.no_grad()
    def send(self, model: torch.nn.Module, *, wire_dtype: str | None, bucket_mb: float,
             what: SyncContent = "full") -> SyncStats | None:
        """Every learner rank calls it; rank 0 broadcasts `what` (cast to `wire_dtype`, e.g. the
        engine's dtype; None keeps the training dtype): "full" every parameter, "adapter" a LoRA
        model's adapter tensors alone, "merged" a LoRA model's base with the adapters merged in
        (`learner.lora`). Returns rank 0's stats, None elsewhere."""
        dtype = dtype_of(wire_dtype) if wire_dtype else None
        metas, stream = STREAMS[what](model, gather=_zero3_gather(self._cfg), dtype=dtype)
        if self._rank != 0:
            for _ in stream:  # take part in the gathers only
                pass
            return None
        if self._group is None:
            _finish_gathers(stream)
            raise RuntimeError("broadcast_weights before join_weight_group on learner rank 0")
        try:
            return send_weights(self._group, metas, stream, bucket_bytes=int(bucket_mb * (1 << 20)))
        except Exception:
            _finish_gathers(stream)  # a failed send (the group is aborted) must not strand the other ranks
            raise
        finally:
            release_cached_memory()

    def close(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.close()
