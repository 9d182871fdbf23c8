"""The in-place handover (`weightsync.ipc`): a learner process streams the weights through a ring
of staging slots, an engine process on the same device loads each chunk as it is filled, the
learner frees the ring after the engine answered; either side failing stops the other. On CPU the
transport is real shared memory between two real processes; the CUDA IPC path differs only in how
the ring is exported and opened, and those two steps are pinned here without a GPU (the measured
handover on one GPU is bench/gpu_check.py's)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import threading
from pathlib import Path

import pytest
import torch

from weightsync import ipc
from weightsync.ipc import DEVICE_ARG, HandoverExporter, local_cuda_args, open_handover
from weightsync.protocol import metas_of

CTX = mp.get_context("spawn")


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 50))


def _export(model: torch.nn.Module, exporter: HandoverExporter, *, bucket_bytes: int = 2048, dtype=None):
    named = list(model.named_parameters())
    return exporter.export(metas_of(named, dtype=dtype), ((n, p.data) for n, p in named), bucket_bytes=bucket_bytes)


@torch.no_grad()
def _load(model: torch.nn.Module, handover) -> int:
    params, count = dict(model.named_parameters()), 0
    for bucket in open_handover(handover):
        for name, tensor in bucket:
            params[name].copy_(tensor)
            count += 1
    return count


def _segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob(f"{ipc.SHM_PREFIX}*")}


def _receive_in_child(handover, conn) -> None:
    model = _model(1)
    count = _load(model, handover)
    conn.send((count, {n: p.detach().tolist() for n, p in model.named_parameters()}))  # plain data: no fd passing


def test_another_process_loads_every_chunk_through_the_ring_and_the_learner_frees_it_after():
    sender, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    handover = _export(sender, exporter)
    assert len(handover.chunks) > handover.slots == ipc.SLOTS  # the ring is refilled while the engine reads
    assert handover.slot_bytes * handover.slots < handover.nbytes  # staging smaller than the weights
    names = {handover.ring, handover.control}
    assert exporter.holding == 2 and names <= _segments()
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_receive_in_child, args=(handover, child))
    proc.start()
    count, received = parent.recv()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert count == len(list(sender.parameters())) == handover.num_tensors
    for name, p in sender.named_parameters():
        assert torch.equal(torch.tensor(received[name]), p.detach())
    assert names <= _segments()  # the engine's exit did not take the learner's segments
    assert exporter.release() == 2
    assert not names & _segments()


def test_a_stream_of_collectives_is_staged_whole_on_the_callers_thread():
    model, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    named, reads = list(model.named_parameters()), []

    def stream():  # records which thread reads each tensor, as a ZeRO-3 gather would run there
        for name, p in named:
            reads.append(threading.get_ident())
            yield name, p.data

    handover = exporter.export(metas_of(named), stream(), bucket_bytes=2048, background=False)
    assert len(reads) == len(named) and set(reads) == {threading.get_ident()}  # all read before it returned
    assert handover.slots == len(handover.chunks) > ipc.SLOTS and handover.slot_bytes * handover.slots >= handover.nbytes
    receiver = _model(1)
    assert _load(receiver, handover) == len(named)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), receiver.parameters()))
    assert exporter.release() == 2


def test_wire_dtype_cast_and_a_second_export_releases_the_first():
    sender, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    first = _export(sender, exporter)
    second = _export(sender, exporter, dtype=torch.bfloat16, bucket_bytes=1 << 20)
    assert not {first.ring, first.control} & _segments()
    assert {m.dtype for c in second.chunks for m in c} == {"bfloat16"} and len(second.chunks) == second.slots == 1
    receiver = _model(1)
    assert _load(receiver, second) == 5
    for (_, a), (_, b) in zip(sender.named_parameters(), receiver.named_parameters()):
        assert torch.equal(b, a.detach().to(torch.bfloat16).to(torch.float32))
    exporter.release()


def test_a_stream_that_disagrees_with_its_header_frees_what_it_packed():
    model, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    named = list(model.named_parameters())
    before = _segments()
    with pytest.raises(ValueError, match="announced"):
        exporter.export(metas_of(named), iter(named[::-1]), bucket_bytes=2048)
    assert exporter.holding == 0 and _segments() == before


def test_a_stream_failing_after_the_first_chunk_stops_the_engine_and_the_release_reports_it():
    model, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    named = list(model.named_parameters())
    stream = [*named[:3], named[4], named[3]]  # the last two out of order: past the first two chunks
    handover = exporter.export(metas_of(named), iter(stream), bucket_bytes=2048)
    assert len(handover.chunks) > handover.slots
    with pytest.raises(ipc.HandoverError, match="learner failed"):
        _load(_model(1), handover)
    with pytest.raises(ValueError, match="announced"):
        exporter.release()
    assert exporter.holding == 0 and not {handover.ring, handover.control} & _segments()


def test_an_engine_that_stops_reading_releases_the_learner_at_once():
    model, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    handover = _export(model, exporter)
    chunks = open_handover(handover)
    next(chunks)
    chunks.close()  # the engine gave up after its first chunk
    with pytest.raises(ipc.HandoverError, match="engine failed"):
        exporter.release()
    assert exporter.holding == 0


def test_a_learner_that_never_fills_times_out_the_engine_with_a_clear_error():
    exporter = HandoverExporter(torch.device("cpu"))
    handover = _export(_model(0), exporter)
    late = dataclasses.replace(handover, chunks=(*handover.chunks, handover.chunks[0]), timeout_s=0.2)
    with pytest.raises(ipc.HandoverError, match="no answer from the learner in 0 s"):
        _load(_model(1), late)
    exporter.release()


def test_cuda_handles_name_their_gpu_and_the_receiver_uses_its_own_ordinal_of_it():
    args = tuple(range(8))
    local = local_cuda_args(args, "GPU-b", ["GPU-a", "GPU-b"])
    assert local[DEVICE_ARG] == 1 and local[:DEVICE_ARG] == list(range(DEVICE_ARG))
    with pytest.raises(RuntimeError, match="must share one GPU"):
        local_cuda_args(args, "GPU-c", ["GPU-a", "GPU-b"])


def test_the_cuda_transport_runs_the_same_protocol(monkeypatch):
    """The exporter on a CUDA device exports the ring's reduce_tensor handle tagged with the GPU's
    UUID and the receiver rebuilds it; with both steps standing in (no GPU here) the bytes
    round-trip through the same ring and control block."""
    store: dict[int, torch.Tensor] = {}

    def fake_allocate(self, size):
        ring = torch.empty(size, dtype=torch.uint8)
        store[id(ring)] = ring
        self._held.append(ring)
        return ring, (id(ring),)

    class Stream:
        def synchronize(self):
            return None

    monkeypatch.setattr(HandoverExporter, "_allocate", fake_allocate)
    monkeypatch.setattr(ipc, "gpu_uuid", lambda device: "GPU-x")
    monkeypatch.setattr(ipc, "_cuda_open", lambda handover: store[handover.ring[0]])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    exporter = HandoverExporter(torch.device("cuda", 0))
    model = _model(0)
    named = list(model.named_parameters())
    handover = exporter.export(metas_of(named), ((n, p.data.clone()) for n, p in named), bucket_bytes=2048)
    assert handover.transport == "cuda" and handover.device_uuid == "GPU-x" and len(handover.chunks) > handover.slots
    receiver = _model(1)
    _load(receiver, handover)
    for (_, a), (_, b) in zip(model.named_parameters(), receiver.named_parameters()):
        assert torch.equal(a, b)
    assert exporter.release() == 2 and exporter.holding == 0
