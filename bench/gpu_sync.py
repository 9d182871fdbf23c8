"""The GPU check's weight sync into a second process, over the project's weight-sync protocol.

What is project code and what is not:
- project: `weightsync.stream.parameter_stream` (the learner's weights as a header + stream),
  `weightsync.protocol.send_weights` (header, bucket packing, one collective per bucket) on a
  `weightsync.group.WeightGroup` of ONE rank (ProcessGroupNCCL on a GPU, gloo on CPU), and on the
  receiving side `weightsync.protocol.receive_weights` (header decoding, bucket unpacking) driven
  by `rollout_workers.engines.hf_engine.HFEngine.receive_weights` (the copy into the engine's
  transformers model, with its count check);
- bench only (this module): the transport between the two processes. weightsync/ has no CUDA IPC
  transport (its groups span processes through NCCL or gloo, and NCCL refuses two ranks on one
  GPU), so `IpcSender` is the one-rank `WeightGroup` whose `broadcast` also hands the very tensor
  it broadcast to the receiver (a CUDA IPC handle through torch.multiprocessing on a GPU, shared
  memory on CPU) and waits until the receiver has copied it, and `IpcReceiver` stands in for the
  receiver's group: its `broadcast` copies the next handed-off tensor in place. Every byte the
  receiver loads went through the project's packing on one side and unpacking on the other.

The receiving process (`engine_process`) loads `HFEngine` from the model directory, zeroes its
weights (so only received weights can match), scores a fixed batch before and after the sync,
reports a per-parameter checksum, and then samples from the synced engine (`generate_seeded`)
for the engine-vs-learner log-prob gap.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from weightsync.group import GroupSpec, WeightGroup

POLL_S = 1.0


@dataclass(frozen=True)
class Channel:
    """The queues between the sender (this process) and the receiving process."""

    tensors: Any  # sender -> receiver: the tensor of each broadcast
    acks: Any  # receiver -> sender: "copied"
    results: Any  # receiver -> sender: one dict per stage, or {"error": ...}

    @staticmethod
    def create(ctx) -> Channel:
        return Channel(ctx.Queue(), ctx.Queue(), ctx.Queue())


def wait_for(q, peer, *, timeout_s: float, what: str):
    """The next item of `q`, polling so that a peer process that died fails at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=POLL_S)
        except queue.Empty:
            if not peer.is_alive():
                raise RuntimeError(f"the other process exited (code {peer.exitcode}) while {what}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from the other process within {timeout_s:g} s while {what}") from None


@contextlib.contextmanager
def shareable_cuda_memory(device: torch.device) -> Iterator[None]:
    """While active, new CUDA allocations are plain cudaMalloc segments: CUDA IPC cannot share
    expandable segments in an unprivileged container (pidfd_getfd is refused), and gpu_check turns
    them on for the training measurements."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class IpcSender(WeightGroup):
    """A one-rank weight-sync group whose broadcasts also reach one receiver in another process."""

    def __init__(self, backend: str, channel: Channel, child, *, timeout_s: float):
        import torch.distributed as dist

        spec = GroupSpec(name=f"gpu-check-{time.monotonic_ns()}", members=("learner",), timeout_s=timeout_s,
                         backend=backend)
        super().__init__(spec, 0, store=dist.HashStore())
        self._channel, self._child = channel, child

    def broadcast(self, tensor: torch.Tensor, *, what: str) -> None:
        super().broadcast(tensor, what=what)  # the project's collective on its one-rank group
        _synchronize(tensor.device)
        self._channel.tensors.put(tensor)
        wait_for(self._channel.acks, self._child, timeout_s=self.spec.timeout_s, what=f"receiving {what}")


class IpcReceiver:
    """The receiving side's stand-in for its `WeightGroup` (rank 1 of the sender's broadcasts)."""

    rank = 1

    def __init__(self, channel: Channel, device: torch.device):
        self._channel, self.device = channel, device

    def broadcast(self, tensor: torch.Tensor, *, what: str) -> None:
        shared = wait_for(self._channel.tensors, mp.parent_process(), timeout_s=float("inf"), what=f"waiting for {what}")
        tensor.copy_(shared)
        _synchronize(tensor.device)
        del shared
        self._channel.acks.put(what)

    def close(self) -> None:
        pass


def checksums(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, float]:
    """Per parameter: the float64 sum of its values in `dtype` (equal values give equal sums)."""
    return {name: float(p.detach().to(dtype).double().sum()) for name, p in model.named_parameters()}


@dataclass(frozen=True)
class EngineJob:
    """What the receiving process does besides receiving."""

    model_dir: str
    device: str  # "cuda" or "cpu"
    score_batch: Any  # a learner.types.TokenBatch scored before and after the sync
    prompts: list[list[int]]
    max_tokens: int
    seeds: list[int]


def _score(engine, batch) -> torch.Tensor:
    from learner.logprobs import response_logprobs

    with torch.inference_mode():
        return response_logprobs(engine.model, batch, temperature=1.0).logp.float().cpu()


def _serve(job: EngineJob, channel: Channel) -> None:
    from rollout_workers.config import EngineConfig
    from rollout_workers.engines.hf_engine import HFEngine

    t0 = time.perf_counter()
    engine = HFEngine(job.model_dir, EngineConfig(engine="hf", dtype="bfloat16", device=job.device))
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    channel.results.put({"load_s": time.perf_counter() - t0, "logp_before": _score(engine, job.score_batch)})
    engine._group = IpcReceiver(channel, engine.device)  # in place of join_weight_group's NCCL/gloo group
    t0 = time.perf_counter()
    count = engine.receive_weights()
    _synchronize(engine.device)
    seconds = time.perf_counter() - t0
    channel.results.put({"tensors": count, "receive_s": seconds, "checksums": checksums(engine.model, torch.bfloat16),
                         "logp_after": _score(engine, job.score_batch)})
    t0 = time.perf_counter()
    gens = engine.generate_seeded(job.prompts, temperature=1.0, top_p=1.0, max_tokens=job.max_tokens, seeds=job.seeds)
    channel.results.put({"generate_s": time.perf_counter() - t0, "token_ids": [list(g.token_ids) for g in gens],
                         "logprobs": [list(g.logprobs) for g in gens]})


def engine_process(job: EngineJob, channel: Channel) -> None:
    """The receiving process's entry point: every failure is reported, then the process exits."""
    try:
        _serve(job, channel)
    except BaseException as err:
        channel.results.put({"error": f"{type(err).__name__}: {str(err)[:300]}"})
        raise


def start_engine_process(job: EngineJob) -> tuple[Any, Channel]:
    """The receiving process, started (spawn: CUDA cannot be forked) and its channel."""
    ctx = mp.get_context("spawn")
    channel = Channel.create(ctx)
    child = ctx.Process(target=engine_process, args=(job, channel), daemon=True)
    child.start()
    return child, channel


def result(channel: Channel, child, *, timeout_s: float, what: str) -> dict:
    """The receiving process's next report; its error becomes this process's."""
    out = wait_for(channel.results, child, timeout_s=timeout_s, what=what)
    if "error" in out:
        raise RuntimeError(f"receiving process, {what}: {out['error']}")
    return out
