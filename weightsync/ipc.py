"""In-place weight handover between processes on one device (`sync.method: handover`, colocated
placement, docs/architecture.md "Placement"): the learner rank packs the weights into buckets on
its own device and exports a handle per bucket; the engine rank on the same device opens the
handles, loads the tensors, and acknowledges (its call returns); only then does the learner free
the buckets. No process group is formed (NCCL refuses two ranks on one GPU) and nothing passes
through the object store but the handles.

One protocol, two transports:
- GPU: CUDA IPC. A bucket's handle is the argument tuple of
  `torch.multiprocessing.reductions.reduce_tensor` plus the physical GPU's UUID; the receiver
  rebuilds it with `rebuild_cuda_tensor` after replacing the device index (argument 6) by its own
  ordinal of that GPU (processes see different CUDA_VISIBLE_DEVICES), as vLLM 0.32's
  `vllm/distributed/weight_transfer/ipc_engine.py` (`IPCWeightTransferEngine`) does.
- CPU: POSIX shared memory (`multiprocessing.shared_memory`). The handle names the segment; the
  receiver maps it and reads the same byte layout. This is how the whole path runs in CI.

The bucket layout is the broadcast protocol's (`weightsync.protocol.plan_buckets`: tensors back
to back as raw bytes, a tensor larger than a bucket alone), so both sides share the header types.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from weightsync.protocol import TensorMeta, dtype_of, plan_buckets

SHM_PREFIX = "agentrl-handover-"
"""Name prefix of the shared-memory segments (under /dev/shm while a handover is in flight)."""
DEVICE_ARG = 6
"""Index of the device ordinal in `reduce_tensor`'s argument tuple for a CUDA tensor."""


@dataclass(frozen=True)
class BucketHandle:
    transport: Literal["shm", "cuda"]
    ref: Any
    """shm: the segment's name; cuda: `reduce_tensor`'s argument tuple."""
    nbytes: int
    tensors: tuple[TensorMeta, ...]
    """The tensors packed in the bucket, in order."""
    device_uuid: str | None = None
    """cuda: the physical GPU holding the bucket (the receiver must be on it)."""


@dataclass(frozen=True)
class Handover:
    """Everything one engine rank needs to load one set of weights."""

    buckets: tuple[BucketHandle, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def num_tensors(self) -> int:
        return sum(len(b.tensors) for b in self.buckets)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def gpu_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def local_cuda_args(args: Sequence[Any], device_uuid: str, local_uuids: Sequence[str]) -> list[Any]:
    """`reduce_tensor`'s arguments with the device ordinal replaced by this process's ordinal of the
    GPU named `device_uuid` (pure). Raises when that GPU is not visible here: the engine rank is not
    on the learner rank's device, so in-place handover cannot work."""
    if device_uuid not in local_uuids:
        raise RuntimeError(f"the handover's GPU {device_uuid} is not visible to this process (it sees "
                           f"{list(local_uuids)}): the engine rank and its learner rank must share one GPU "
                           "(ray.placement=colocated)")
    out = list(args)
    out[DEVICE_ARG] = list(local_uuids).index(device_uuid)
    return out


class HandoverExporter:
    """The learner rank's side: `export` packs and exports the buckets and keeps them alive until
    `release` (after the engine acknowledged)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._held: list[Any] = []  # bucket tensors (cuda) or SharedMemory segments (shm)

    @property
    def transport(self) -> Literal["shm", "cuda"]:
        return "cuda" if self.device.type == "cuda" else "shm"

    @property
    def holding(self) -> int:
        """Buckets exported and not yet released."""
        return len(self._held)

    @torch.no_grad()
    def export(self, metas: list[TensorMeta], tensors: Iterable[tuple[str, torch.Tensor]], *,
               bucket_bytes: int) -> Handover:
        """Copy the stream (in the order of `metas`, each cast to its meta's dtype) into buckets and
        export one handle per bucket. Buckets of an earlier export still held are released first."""
        self.release()
        stream = iter(tensors)
        handles = []
        try:
            for bucket in plan_buckets(metas, bucket_bytes):
                group = [metas[i] for i in bucket]
                size = sum(m.nbytes for m in group)
                buffer, ref, owner = self._allocate(size)
                self._held.append(owner)
                try:
                    self._fill(buffer, group, stream)
                finally:
                    del buffer  # a mapped segment cannot close while a tensor views it
                handles.append(self._handle(ref, size, group))
        except Exception:
            self.release()
            raise
        return Handover(tuple(handles))

    def _fill(self, buffer: torch.Tensor, group: list[TensorMeta], stream: Iterator[tuple[str, torch.Tensor]]) -> None:
        offset = 0
        for meta in group:
            name, t = next(stream, (None, None))
            if name != meta.name or t is None or tuple(t.shape) != meta.shape:
                raise ValueError(f"the weight stream yielded {name!r} where {meta.name!r} {meta.shape} was announced")
            buffer[offset : offset + meta.nbytes].copy_(_as_bytes(t.detach().to(buffer.device, dtype_of(meta.dtype))))
            offset += meta.nbytes

    def _allocate(self, size: int) -> tuple[torch.Tensor, Any, Any]:
        if self.transport == "cuda":
            buffer = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
            return buffer, cuda_export(buffer), buffer
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(name=f"{SHM_PREFIX}{uuid.uuid4().hex}", create=True, size=max(size, 1))
        return torch.frombuffer(shm.buf, dtype=torch.uint8, count=max(size, 1)), shm.name, shm

    def _handle(self, ref: Any, size: int, group: list[TensorMeta]) -> BucketHandle:
        dev_uuid = gpu_uuid(self.device) if self.transport == "cuda" else None
        return BucketHandle(self.transport, ref, size, tuple(group), dev_uuid)

    def release(self) -> int:
        """Free every held bucket (after the engine acknowledged); returns how many."""
        held, self._held = self._held, []
        count = len(held)
        while held:
            owner = held.pop()
            if self.transport == "shm":
                owner.close()
                owner.unlink()
            del owner
        if count and self.transport == "cuda":
            torch.cuda.ipc_collect()  # the engine's references to the handles are gone: reclaim them
            torch.cuda.empty_cache()
        return count


def cuda_export(buffer: torch.Tensor) -> tuple:
    """The CUDA IPC handle of `buffer` (`reduce_tensor`'s argument tuple)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return args


def _cuda_open(handle: BucketHandle) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    uuids = [gpu_uuid(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    return rebuild_cuda_tensor(*local_cuda_args(handle.ref, handle.device_uuid or "", uuids))


@contextlib.contextmanager
def _opened(handle: BucketHandle) -> Iterator[torch.Tensor]:
    if handle.transport == "cuda":
        buffer = _cuda_open(handle)
        try:
            yield buffer
        finally:
            del buffer
            torch.cuda.synchronize()
        return
    import _posixshmem  # what multiprocessing.shared_memory opens segments with
    import mmap
    import os

    # Mapped directly, not through SharedMemory: that would register the segment with this
    # process's resource tracker, which a multiprocessing child shares with its parent (the
    # exporter), and unregistering it there would cancel the exporter's own clean-up at exit.
    fd = _posixshmem.shm_open("/" + handle.ref, os.O_RDWR, mode=0o600)
    try:
        mapping = mmap.mmap(fd, max(handle.nbytes, 1))
    finally:
        os.close(fd)
    buffer = torch.frombuffer(mapping, dtype=torch.uint8, count=max(handle.nbytes, 1))
    try:
        yield buffer
    finally:
        del buffer
        mapping.close()


def open_handover(handover: Handover) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The engine rank's side: yield each bucket's (name, tensor) list. The tensors are views into
    the learner's bucket, valid until the next bucket is requested: copy them before that."""
    for handle in handover.buckets:
        with _opened(handle) as buffer:
            out, offset = [], 0
            for meta in handle.tensors:
                view = buffer[offset : offset + meta.nbytes].view(dtype_of(meta.dtype)).view(meta.shape)
                out.append((meta.name, view))
                offset += meta.nbytes
            yield out
            out.clear()  # the views pin the mapping: drop them before it closes
