"""The few collectives the learner step needs beyond the optimiser's own (sums over data-parallel
ranks, a barrier, a gather of picklable objects). Each is a no-op on one rank or without an
initialised process group."""

from __future__ import annotations

from typing import Any

import torch


def distributed(world_size: int) -> bool:
    """Several ranks with an initialised default process group."""
    return world_size > 1 and torch.distributed.is_initialized()


def all_reduce_sums(values: dict[str, float], *, world_size: int, device: torch.device) -> dict[str, float]:
    """Sum each named float over ranks (float64, one all-reduce in sorted key order)."""
    if not distributed(world_size):
        return dict(values)
    keys = sorted(values)
    vec = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(vec)
    return dict(zip(keys, vec.tolist()))


def all_reduce_tensor(t: torch.Tensor, *, world_size: int, device: torch.device) -> torch.Tensor:
    """Sum over ranks (float64 on `device`), back on the CPU as float32; `t` itself on one rank."""
    if not distributed(world_size):
        return t
    vec = t.to(device, torch.float64)
    torch.distributed.all_reduce(vec)
    return vec.float().cpu()


def barrier(world_size: int) -> None:
    if distributed(world_size):
        torch.distributed.barrier()


def all_reduce_max(value: float, *, world_size: int, device: torch.device) -> float:
    """The largest `value` over ranks (float64)."""
    if not distributed(world_size):
        return float(value)
    vec = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(vec, op=torch.distributed.ReduceOp.MAX)
    return float(vec.item())


def all_gather_objects(value: Any, *, world_size: int) -> list[Any]:
    """Every rank's `value` in rank order (pickled over the default group); `[value]` on one rank."""
    if not distributed(world_size):
        return [value]
    out: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(out, value)
    return out
