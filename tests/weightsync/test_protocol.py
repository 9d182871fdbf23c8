"""weightsync/ on real gloo groups between spawned processes: packing is exact for every dtype
and bucket size, the group never touches the default process group, and a member that dies
mid-sync turns into a WeightSyncError naming its peer within the group's timeout (no hang)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from weightsync.group import GroupSpec, WeightGroup, WeightSyncError
from weightsync.protocol import (
    TensorMeta,
    decode_header,
    encode_header,
    metas_of,
    plan_buckets,
    receive_weights,
    send_weights,
)
from weightsync.stream import parameter_stream

CTX = mp.get_context("spawn")


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("a.weight", torch.randn(300, 70, generator=g)),
            ("b.bias", torch.randn(5, generator=g).to(torch.bfloat16)),
            ("c.weight", torch.randn(64, 64, generator=g).to(torch.float16)),
            ("d.big", torch.randn(200_000, generator=g)),
            ("e.steps", torch.arange(7, dtype=torch.int64))]


def test_buckets_close_before_overflow_and_big_tensors_travel_alone():
    metas = [TensorMeta("x", "float32", (10,)), TensorMeta("y", "float32", (10,)),
             TensorMeta("big", "float32", (1000,)), TensorMeta("z", "bfloat16", (4,))]
    assert plan_buckets(metas, 80) == [[0, 1], [2], [3]]
    assert plan_buckets(metas, 1 << 20) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(metas, 0)
    assert decode_header(encode_header(metas, [[0, 1], [2, 3]])) == (metas, [[0, 1], [2, 3]])


def test_tied_weights_stream_once_in_named_parameters_order():
    emb = torch.nn.Embedding(10, 4)
    model = torch.nn.ModuleDict({"embed": emb, "head": torch.nn.Linear(4, 10, bias=False)})
    model["head"].weight = emb.weight
    metas, stream = parameter_stream(model, dtype=torch.bfloat16)
    assert [m.name for m in metas] == [n for n, _ in model.named_parameters()] == ["embed.weight"]
    assert metas[0].dtype == "bfloat16" and [n for n, _ in stream] == ["embed.weight"]


def _fingerprint(t: torch.Tensor) -> tuple:
    """dtype, shape and a digest of the exact bytes (a float sum would depend on each process's
    reduction order, not on what arrived)."""
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    return t.dtype, tuple(t.shape), hashlib.sha256(raw).hexdigest()


def _receiver(spec: GroupSpec, rank: int, queue, die_after_buckets: int | None) -> None:
    import torch.distributed as dist

    group = WeightGroup(spec, rank)
    got = {}
    try:
        for k, bucket in enumerate(receive_weights(group)):
            if die_after_buckets is not None and k + 1 == die_after_buckets:
                os.kill(os.getpid(), signal.SIGKILL)
            got.update({n: t.clone() for n, t in bucket})
    except WeightSyncError as err:
        queue.put(("error", str(err)))
        return
    queue.put(("ok", {n: _fingerprint(t) for n, t in got.items()},
               dist.is_initialized()))


def _sender(spec: GroupSpec, queue, die_at: str) -> None:
    tensors = _tensors()
    group = WeightGroup(spec, 0)

    def stream():
        for name, t in tensors:
            if name == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            yield name, t

    send_weights(group, metas_of(tensors), stream(), bucket_bytes=4096)
    queue.put("sent")


def _spec(tmp_path, n: int, timeout_s: float = 20.0) -> GroupSpec:
    members = ("learner_0", *(f"rollout_worker_{i}" for i in range(n - 1)))
    return GroupSpec(name=f"t{time.monotonic_ns()}", members=members, timeout_s=timeout_s,
                     store_file=str(tmp_path / "store"))


def test_two_receivers_get_every_tensor_exactly(tmp_path, monkeypatch):
    import torch.distributed as dist

    # The sender must not build a default process group. Checked by refusing one, not only by
    # dist.is_initialized() afterwards: an earlier test in this process (vLLM run in-process) may
    # have left its own default group behind.
    default_before = dist.is_initialized()
    monkeypatch.setattr(dist, "init_process_group",
                        lambda *a, **k: pytest.fail("the weight group built a default process group"))
    spec = _spec(tmp_path, 3)
    queue = CTX.Queue()
    procs = [CTX.Process(target=_receiver, args=(spec, r, queue, None)) for r in (1, 2)]
    for p in procs:
        p.start()
    tensors = _tensors()
    stats = send_weights(WeightGroup(spec, 0), metas_of(tensors), iter(tensors), bucket_bytes=4096)
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert stats.tensors == 5 and stats.buckets > 3 and stats.bytes == sum(t.nbytes for _, t in tensors)
    want = {n: _fingerprint(t) for n, t in tensors}
    for status, got, default_group in results:
        assert status == "ok" and got == want and default_group is False
    assert dist.is_initialized() == default_before  # the sender's default group is untouched too


def test_receiver_killed_mid_sync_names_it_on_the_sender(tmp_path):
    spec = _spec(tmp_path, 2, timeout_s=20.0)
    queue = CTX.Queue()  # held until the child has it
    proc = CTX.Process(target=_receiver, args=(spec, 1, queue, 2))
    proc.start()
    group = WeightGroup(spec, 0)
    tensors = _tensors()
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"learner_0 \(weight-sync rank 0\) failed sending to rollout_worker_0"):
        send_weights(group, metas_of(tensors), iter(tensors), bucket_bytes=4096)
    assert time.monotonic() - start < spec.timeout_s + 5
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


def test_sender_killed_mid_sync_names_it_on_the_receiver(tmp_path):
    spec = _spec(tmp_path, 2, timeout_s=15.0)
    queue = CTX.Queue()
    proc = CTX.Process(target=_sender, args=(spec, queue, "d.big"))
    proc.start()
    group = WeightGroup(spec, 1)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"rollout_worker_0 \(weight-sync rank 1\) failed receiving from learner_0"):
        for _ in receive_weights(group):
            pass
    assert time.monotonic() - start < spec.timeout_s + 5
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


def test_a_member_that_never_joins_fails_the_rendezvous_within_the_timeout(tmp_path):
    spec = _spec(tmp_path, 2, timeout_s=3.0)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="could not join weight-sync group .* members: learner_0, rollout_worker_0"):
        WeightGroup(spec, 0)
    assert time.monotonic() - start < 3.0 + 5
