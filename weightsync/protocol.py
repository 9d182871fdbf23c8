"""The wire protocol of a weight sync over a `WeightGroup`: first a header (every tensor's name,
dtype and shape, and how they are packed into buckets), then the tensors themselves, packed
back to back as raw bytes into buckets of about `bucket_bytes` each (a tensor larger than that
travels alone). Rank 0 streams: it only needs the shapes up front (under ZeRO-3 they are known
without gathering) and the tensors one by one in header order, so it never holds more than one
bucket (plus whatever the caller gathered) at a time. Receivers get the tensors bucket by bucket
as views into one reused buffer, so they too hold one bucket at a time.

Pure packing (`plan_buckets`, header encoding) is separate from the collectives (`send_weights`,
`receive_weights`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from weightsync.group import WeightGroup

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    """torch dtype name without the "torch." prefix, e.g. "bfloat16"."""
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=dtype_of(self.dtype)).element_size()


@dataclass(frozen=True)
class SyncStats:
    tensors: int
    buckets: int
    bytes: int


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown dtype {name!r} in a weight-sync header")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Consecutive tensor indices per bucket: a bucket is closed before it would exceed
    `bucket_bytes`; a tensor larger than that gets a bucket of its own."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[int]] = []
    size = 0
    for i, meta in enumerate(metas):
        if buckets and size + meta.nbytes <= bucket_bytes:
            buckets[-1].append(i)
            size += meta.nbytes
        else:
            buckets.append([i])
            size = meta.nbytes
    return buckets


def encode_header(metas: list[TensorMeta], buckets: list[list[int]]) -> bytes:
    return json.dumps({"protocol": PROTOCOL_VERSION, "buckets": buckets,
                       "tensors": [[m.name, m.dtype, list(m.shape)] for m in metas]}).encode()


def decode_header(data: bytes) -> tuple[list[TensorMeta], list[list[int]]]:
    obj = json.loads(data.decode())
    if obj.get("protocol") != PROTOCOL_VERSION:
        raise ValueError(f"weight-sync protocol {obj.get('protocol')} received, this side speaks {PROTOCOL_VERSION}")
    metas = [TensorMeta(name, dtype, tuple(shape)) for name, dtype, shape in obj["tensors"]]
    return metas, [list(b) for b in obj["buckets"]]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def send_weights(group: WeightGroup, metas: list[TensorMeta], tensors: Iterable[tuple[str, torch.Tensor]], *,
                 bucket_bytes: int) -> SyncStats:
    """Rank 0: broadcast the header, then every bucket. `tensors` yields (name, tensor) in the
    order of `metas`; each tensor is cast to its meta's dtype and copied into the bucket before
    the next one is requested (so a caller may free or re-partition it after the yield)."""
    if group.rank != 0:
        raise ValueError("only weight-sync rank 0 sends")
    buckets = plan_buckets(metas, bucket_bytes)
    header = torch.frombuffer(bytearray(encode_header(metas, buckets)), dtype=torch.uint8)
    group.broadcast(torch.tensor([header.numel()], dtype=torch.int64, device=group.device), what="the header size")
    group.broadcast(header.to(group.device), what="the header")
    sizes = [sum(metas[i].nbytes for i in b) for b in buckets]
    buffer = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=group.device)
    stream = iter(tensors)
    for k, (bucket, size) in enumerate(zip(buckets, sizes)):
        offset = 0
        for i in bucket:
            meta = metas[i]
            try:
                name, t = next(stream)
            except StopIteration:
                raise ValueError(f"the weight stream ended before {meta.name!r}") from None
            if name != meta.name or tuple(t.shape) != meta.shape:
                raise ValueError(f"the weight stream yielded {name!r} {tuple(t.shape)} where the header "
                                 f"announced {meta.name!r} {meta.shape}")
            raw = _as_bytes(t.detach().to(group.device, dtype_of(meta.dtype)))
            buffer[offset : offset + meta.nbytes].copy_(raw)
            offset += meta.nbytes
        group.broadcast(buffer[:size], what=f"bucket {k + 1}/{len(buckets)}")
    return SyncStats(tensors=len(metas), buckets=len(buckets), bytes=sum(sizes))


def receive_weights(group: WeightGroup) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Ranks > 0: yield each bucket's (name, tensor) list. The tensors are views into one buffer
    that the next bucket overwrites: consume (copy) them before asking for the next bucket."""
    if group.rank == 0:
        raise ValueError("weight-sync rank 0 sends; it cannot receive")
    size = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(size, what="the header size")
    header = torch.empty(int(size.item()), dtype=torch.uint8, device=group.device)
    group.broadcast(header, what="the header")
    metas, buckets = decode_header(header.cpu().numpy().tobytes())
    sizes = [sum(metas[i].nbytes for i in b) for b in buckets]
    buffer = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=group.device)
    for k, (bucket, size_k) in enumerate(zip(buckets, sizes)):
        group.broadcast(buffer[:size_k], what=f"bucket {k + 1}/{len(buckets)}")
        out, offset = [], 0
        for i in bucket:
            meta = metas[i]
            raw = buffer[offset : offset + meta.nbytes]
            out.append((meta.name, raw.view(dtype_of(meta.dtype)).view(meta.shape)))
            offset += meta.nbytes
        yield out


def release_cached_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back to the driver after a sync: its buckets
    (one `sync.bucket_mb` bucket at a time, plus the receiver's copies) would otherwise stay
    reserved beside the engine's KV cache or the learner's activations. A no-op without CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def metas_of(named: Iterable[tuple[str, torch.Tensor]], *, dtype: torch.dtype | None = None) -> list[TensorMeta]:
    """Header entries for (name, tensor) pairs; a ZeRO-3 partitioned parameter reports its full
    shape through `ds_shape`. `dtype` overrides the wire dtype (e.g. the engine's)."""
    out = []
    for name, t in named:
        shape = tuple(getattr(t, "ds_shape", None) or t.shape)
        out.append(TensorMeta(name, dtype_name(dtype or t.dtype), tuple(int(d) for d in shape)))
    return out
