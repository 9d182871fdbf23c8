"""In-place weight handover between processes on one device (`sync.method: handover`, colocated
placement, docs/architecture.md "Placement"): the learner rank streams the weights through a small
ring of staging slots on its own device; the engine rank on the same device opens the ring once,
loads each chunk as it is filled and marks it consumed, which frees its slot for the chunk after
next. Only when the engine's call returns (every chunk loaded) does the learner free the ring. No
process group is formed (NCCL refuses two ranks on one GPU) and nothing passes through the object
store but the handles.

The staging memory is `slots` x one bucket (`sync.bucket_mb`), not a second copy of the model: as
vLLM 0.32's packed IPC transfer (`vllm/distributed/weight_transfer/packed_tensor.py`
`packed_ipc_producer`) reuses one buffer across chunks, and with two slots the learner fills one
while the engine copies out of the other. The engine opens the ring once per handover and keeps
it until its last chunk (the pairing of exports and opens that `PackedBufferImporter` there keeps
for CUDA IPC's reference counts). A loaded tensor must be copied before the next chunk is asked
for: its slot is refilled after that.

Who may touch which slot is kept in a control block of four int64 counters in host shared memory
(on both transports): chunks filled, chunks consumed, and a failure flag per side, so that either
side stops at once when the other fails instead of waiting out `timeout_s`. On CUDA the learner
synchronises its stream before announcing a chunk and the engine before marking one consumed.

One protocol, two transports for the ring:
- GPU: CUDA IPC. The handle is the argument tuple of `torch.multiprocessing.reductions.reduce_tensor`
  plus the physical GPU's UUID; the receiver rebuilds it with `rebuild_cuda_tensor` after replacing
  the device index (argument 6) by its own ordinal of that GPU (processes see different
  CUDA_VISIBLE_DEVICES), as vLLM 0.32's `vllm/distributed/weight_transfer/ipc_engine.py` does.
- CPU: POSIX shared memory (`multiprocessing.shared_memory`). The handle names the segment; the
  receiver maps it and reads the same byte layout. This is how the whole path runs in CI.

The chunk layout is the broadcast protocol's (`weightsync.protocol.plan_buckets`: tensors back to
back as raw bytes, a tensor larger than a bucket alone), so both sides share the header types.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
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
SLOTS = 2
"""Staging slots of the ring: the learner fills one while the engine loads the other."""

FILLED, CONSUMED, PRODUCER_FAILED, CONSUMER_FAILED = range(4)
"""The control block's int64 counters."""


class HandoverError(RuntimeError):
    """The other side of a handover failed or stopped answering."""


@dataclass(frozen=True)
class Handover:
    """Everything one engine rank needs to load one set of weights."""

    transport: Literal["shm", "cuda"]
    ring: Any
    """shm: the ring segment's name; cuda: `reduce_tensor`'s argument tuple of the ring."""
    control: str
    """The control block's shared-memory segment (host memory on both transports)."""
    slot_bytes: int
    slots: int
    chunks: tuple[tuple[TensorMeta, ...], ...]
    """The tensors of each chunk, in order; chunk i is staged in slot i % slots."""
    timeout_s: float
    """How long either side waits for the other before giving up."""
    device_uuid: str | None = None
    """cuda: the physical GPU holding the ring (the receiver must be on it)."""

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for chunk in self.chunks for m in chunk)

    @property
    def num_tensors(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


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


# ---- shared memory --------------------------------------------------------------------------------


def _create_segment(size: int):
    from multiprocessing import shared_memory

    return shared_memory.SharedMemory(name=f"{SHM_PREFIX}{uuid.uuid4().hex}", create=True, size=max(size, 1))


@contextlib.contextmanager
def _mapped(name: str, size: int) -> Iterator[Any]:
    """Map an existing segment. Directly, not through SharedMemory: that would register the segment
    with this process's resource tracker, which a multiprocessing child shares with its parent (the
    exporter), and unregistering it there would cancel the exporter's own clean-up at exit."""
    import _posixshmem  # what multiprocessing.shared_memory opens segments with
    import mmap
    import os

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        mapping = mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)
    try:
        yield mapping
    finally:
        mapping.close()


class Control:
    """The four counters of a handover over a shared buffer (its owner's or a mapped one)."""

    SIZE = 32

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def get(self, index: int) -> int:
        return struct.unpack_from("q", self.buf, 8 * index)[0]

    def set(self, index: int, value: int) -> None:
        struct.pack_into("q", self.buf, 8 * index, value)

    def wait(self, index: int, target: int, *, peer_failed: int, timeout_s: float, what: str,
             cancelled: threading.Event | None = None) -> bool:
        """Block until counter `index` reaches `target` (True), or until `cancelled` is set (False);
        raise when the peer flags a failure or `timeout_s` passes first."""
        deadline, pause = time.monotonic() + timeout_s, 2e-5
        while self.get(index) < target:
            if self.get(peer_failed):
                raise HandoverError(f"the handover stopped: the {what} failed (its own log says why)")
            if cancelled is not None and cancelled.is_set():
                return False
            if time.monotonic() > deadline:
                raise HandoverError(f"the handover stopped: no answer from the {what} in {timeout_s:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 2e-4)
        return True


# ---- the learner's side ---------------------------------------------------------------------------


class HandoverExporter:
    """The learner rank's side: `export` allocates the ring, fills the first slot and streams the
    rest from a background thread as the engine frees them; `release` (after the engine's call
    returned) waits for that thread and frees the ring."""

    def __init__(self, device: torch.device, *, slots: int = SLOTS) -> None:
        self.device = device
        self.slots = slots
        self._held: list[Any] = []  # the ring (cuda tensor or segment) and the control segment
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._control: Control | None = None
        self._error: BaseException | None = None

    @property
    def transport(self) -> Literal["shm", "cuda"]:
        return "cuda" if self.device.type == "cuda" else "shm"

    @property
    def holding(self) -> int:
        """Shared allocations held (the ring and its control block) until `release`."""
        return len(self._held)

    def export(self, metas: list[TensorMeta], tensors: Iterable[tuple[str, torch.Tensor]], *,
               bucket_bytes: int, timeout_s: float = 600.0, background: bool = True) -> Handover:
        """Stage the stream (in the order of `metas`, each cast to its meta's dtype) chunk by chunk
        and return the handle the engine rank opens. An earlier export still held is released first.
        Only the first chunk is filled before returning (a stream that disagrees with `metas` there
        raises here); the rest is filled in the background while the engine loads, and a failure
        there fails the engine's side and `release`. `background=False` stages every chunk (one
        slot each) before returning, on the caller's thread: for a stream whose reads are
        collectives (ZeRO-3 gathers), which must not run beside the caller's other calls."""
        self.release()
        chunks = tuple(tuple(metas[i] for i in bucket) for bucket in plan_buckets(metas, bucket_bytes)) if metas else ()
        slot_bytes = max((sum(m.nbytes for m in c) for c in chunks), default=1)
        slots = max(1, min(self.slots, len(chunks)) if background else len(chunks))
        control_segment = _create_segment(Control.SIZE)
        self._held.append(control_segment)
        self._control = Control(control_segment.buf)
        try:
            ring, ref = self._allocate(slot_bytes * slots)
            handover = Handover(self.transport, ref, control_segment.name, slot_bytes, slots, chunks, timeout_s,
                                gpu_uuid(self.device) if self.transport == "cuda" else None)
            stream = iter(tensors)
            with torch.no_grad():
                for i in range(min(len(chunks), 1 if background else len(chunks))):  # a wrong stream fails here
                    self._fill(ring, handover, i, stream)
        except Exception:
            self.release()
            raise
        if background and len(chunks) > 1:
            self._thread = threading.Thread(target=self._stream, args=(ring, handover, stream),
                                            name="weight-handover", daemon=True)
            self._thread.start()
        return handover

    def _stream(self, ring: torch.Tensor, handover: Handover, stream: Iterator[tuple[str, torch.Tensor]]) -> None:
        assert self._control is not None
        try:
            with torch.no_grad():
                for i in range(1, len(handover.chunks)):
                    if not self._control.wait(CONSUMED, i - handover.slots + 1, peer_failed=CONSUMER_FAILED,
                                              timeout_s=handover.timeout_s, what="engine",
                                              cancelled=self._cancelled):
                        return  # released before the engine finished: abandoned, not failed
                    self._fill(ring, handover, i, stream)
        except BaseException as err:  # noqa: BLE001 - kept for `release`, flagged to the engine
            self._error = err
            self._control.set(PRODUCER_FAILED, 1)

    def _fill(self, ring: torch.Tensor, handover: Handover, index: int,
              stream: Iterator[tuple[str, torch.Tensor]]) -> None:
        offset = (index % handover.slots) * handover.slot_bytes
        for meta in handover.chunks[index]:
            name, t = next(stream, (None, None))
            if name != meta.name or t is None or tuple(t.shape) != meta.shape:
                raise ValueError(f"the weight stream yielded {name!r} where {meta.name!r} {meta.shape} was announced")
            ring[offset : offset + meta.nbytes].copy_(_as_bytes(t.detach().to(ring.device, dtype_of(meta.dtype))))
            offset += meta.nbytes
        if self.transport == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        assert self._control is not None
        self._control.set(FILLED, index + 1)

    def _allocate(self, size: int) -> tuple[torch.Tensor, Any]:
        if self.transport == "cuda":
            ring = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
            self._held.append(ring)
            return ring, cuda_export(ring)
        segment = _create_segment(size)
        self._held.append(segment)
        return torch.frombuffer(segment.buf, dtype=torch.uint8, count=max(size, 1)), segment.name

    def release(self) -> int:
        """Free the ring after the engine's call returned (every chunk loaded), or abandon a
        handover the engine did not finish; returns the shared allocations freed. Raises what
        failed the learner's background stream, if anything did."""
        thread, self._thread = self._thread, None
        if thread is not None:
            if self._control is not None and thread.is_alive():
                self._control.set(PRODUCER_FAILED, 1)  # an engine still reading stops instead of waiting
            self._cancelled.set()
            thread.join()
            self._cancelled.clear()
        self._control = None
        held, self._held = self._held, []
        count = len(held)
        while held:
            owner = held.pop()
            if not isinstance(owner, torch.Tensor):
                with contextlib.suppress(BufferError):  # a view may outlive a failed fill until GC
                    owner.close()
                owner.unlink()
            del owner
        if count and self.transport == "cuda":
            torch.cuda.ipc_collect()  # the engine's references to the handles are gone: reclaim them
            torch.cuda.empty_cache()
        error, self._error = self._error, None
        if error is not None:
            raise error
        return count


def cuda_export(buffer: torch.Tensor) -> tuple:
    """The CUDA IPC handle of `buffer` (`reduce_tensor`'s argument tuple)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return args


# ---- the engine's side ----------------------------------------------------------------------------


def _cuda_open(handover: Handover) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    uuids = [gpu_uuid(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    return rebuild_cuda_tensor(*local_cuda_args(handover.ring, handover.device_uuid or "", uuids))


@contextlib.contextmanager
def _opened_ring(handover: Handover) -> Iterator[torch.Tensor]:
    size = handover.slot_bytes * handover.slots
    if handover.transport == "cuda":
        ring = _cuda_open(handover)
        try:
            yield ring
        finally:
            del ring
            torch.cuda.synchronize()
        return
    with _mapped(handover.ring, size) as mapping:
        ring = torch.frombuffer(mapping, dtype=torch.uint8, count=max(size, 1))
        try:
            yield ring
        finally:
            del ring  # a mapping cannot close while a tensor views it


def open_handover(handover: Handover) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The engine rank's side: yield each chunk's (name, tensor) list as the learner fills it. The
    tensors are views into the learner's ring, valid until the next chunk is requested (the slot is
    then handed back for refilling): copy them before that. Stopping early, or failing, tells the
    learner to stop too."""
    with _mapped(handover.control, Control.SIZE) as mapping:
        control = Control(mapping)
        try:
            with _opened_ring(handover) as ring:
                for i, chunk in enumerate(handover.chunks):
                    control.wait(FILLED, i + 1, peer_failed=PRODUCER_FAILED, timeout_s=handover.timeout_s,
                                 what="learner")
                    out, offset = [], (i % handover.slots) * handover.slot_bytes
                    for meta in chunk:
                        view = ring[offset : offset + meta.nbytes].view(dtype_of(meta.dtype)).view(meta.shape)
                        out.append((meta.name, view))
                        offset += meta.nbytes
                    yield out
                    out.clear()  # the views pin the mapping: drop them before it closes
                    if handover.transport == "cuda":
                        torch.cuda.synchronize()
                    control.set(CONSUMED, i + 1)
        except BaseException:
            control.set(CONSUMER_FAILED, 1)
            raise
