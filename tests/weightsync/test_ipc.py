"""The in-place handover (`weightsync.ipc`): a learner process exports buckets, an engine process
on the same device loads them, the learner frees them after the engine answered. On CPU the
transport is real shared memory between two real processes; the CUDA IPC path differs only in how
a bucket is exported and opened, and those two steps are pinned here without a GPU (the measured
handover on one GPU is bench/gpu_check.py's)."""

from __future__ import annotations

import multiprocessing as mp
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


def test_another_process_loads_the_buckets_and_the_learner_frees_them_after_it_answered():
    sender, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    handover = _export(sender, exporter)
    assert len(handover.buckets) > 1 and exporter.holding == len(handover.buckets)
    names = {b.ref for b in handover.buckets}
    assert names <= _segments()
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_receive_in_child, args=(handover, child))
    proc.start()
    count, received = parent.recv()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert count == len(list(sender.parameters()))
    for name, p in sender.named_parameters():
        assert torch.equal(torch.tensor(received[name]), p.detach())
    assert names <= _segments()  # the engine's exit did not take the learner's segments
    assert exporter.release() == len(handover.buckets)
    assert not names & _segments()


def test_wire_dtype_cast_and_a_second_export_releases_the_first():
    sender, exporter = _model(0), HandoverExporter(torch.device("cpu"))
    first = _export(sender, exporter)
    second = _export(sender, exporter, dtype=torch.bfloat16, bucket_bytes=1 << 20)
    assert not {b.ref for b in first.buckets} & _segments()
    assert {m.dtype for b in second.buckets for m in b.tensors} == {"bfloat16"}
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


def test_cuda_handles_name_their_gpu_and_the_receiver_uses_its_own_ordinal_of_it():
    args = tuple(range(8))
    local = local_cuda_args(args, "GPU-b", ["GPU-a", "GPU-b"])
    assert local[DEVICE_ARG] == 1 and local[:DEVICE_ARG] == list(range(DEVICE_ARG))
    with pytest.raises(RuntimeError, match="must share one GPU"):
        local_cuda_args(args, "GPU-c", ["GPU-a", "GPU-b"])


def test_the_cuda_transport_runs_the_same_protocol(monkeypatch):
    """The exporter on a CUDA device exports reduce_tensor handles tagged with the GPU's UUID and
    the receiver rebuilds them; with both steps standing in (no GPU here) the bytes round-trip."""
    store: dict[int, torch.Tensor] = {}

    def fake_allocate(self, size):
        buffer = torch.empty(size, dtype=torch.uint8)
        store[id(buffer)] = buffer
        return buffer, (id(buffer),), buffer

    monkeypatch.setattr(HandoverExporter, "_allocate", fake_allocate)
    monkeypatch.setattr(ipc, "gpu_uuid", lambda device: "GPU-x")
    monkeypatch.setattr(ipc, "_cuda_open", lambda handle: store[handle.ref[0]])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    exporter = HandoverExporter(torch.device("cuda", 0))
    model = _model(0)
    named = list(model.named_parameters())
    handover = exporter.export(metas_of(named), ((n, p.data.clone()) for n, p in named), bucket_bytes=2048)
    assert {b.transport for b in handover.buckets} == {"cuda"} and {b.device_uuid for b in handover.buckets} == {"GPU-x"}
    receiver = _model(1)
    _load(receiver, handover)
    for (_, a), (_, b) in zip(model.named_parameters(), receiver.named_parameters()):
        assert torch.equal(a, b)
    assert exporter.release() == len(handover.buckets) and exporter.holding == 0
