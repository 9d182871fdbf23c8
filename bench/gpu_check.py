"""A GPU check that runs the project's own learner, log-prob, weight-sync and engine code on one GPU.

On the lent device machine (torch, transformers and tokenizers installed; pydantic carried as wheels):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && timeout 400 python3 bench/gpu_check.py --out "$OUT/gpu_check.json"

    python bench/gpu_check.py                      # on a GPU: table + bench/results/gpu_check.json
    python bench/gpu_check.py --tiny --out X.json  # every measurement on CPU with tiny shapes (CI)

Models are random-init Qwen3-1.7B / Qwen2.5-7B shapes written in code (bench/gpu_model.py); the
1.7B one is saved once as an HF directory (bf16 weights, a word-level tokenizer) that the project's
`LearnerWorker` and `HFEngine` load as they load a checkpoint. No vLLM, no Ray, no hub, no network;
DeepSpeed only when it imports. Every measurement names in `exercises` the project functions it ran,
records its own peak device memory (the process's peak RSS on CPU, which only grows) and the memory
already held when it started; an out-of-memory error is recorded and the next measurement runs; a
time budget skips what would start too late. In order:

1. `logprobs_{full,chunked}`: forward + backward of the response log-probs of 16 x 512 = 8,192
   positions at the 1.7B head (151,936 x 2,048, bf16 inputs): full fp32 logits
   (`learner.logprobs.logprobs_from_logits`) vs `learner.logprobs.chunked_logprobs`; memory above
   the inputs, and the largest difference of log-probs and of gradients between the two.
2. `fwd_bwd_7b_{full,ckpt}`: `learner.logprobs.response_logprobs` forward + backward of one
   6,656-token row (log-probs of its last 512 tokens) through the bf16 7B model, without and with
   gradient checkpointing, no optimiser.
3. `learner_train_1.7b_{full,ckpt}`: `LearnerWorker.train_step` with `TorchBackend` (fp32 weights,
   bf16 autocast, AdamW, a bf16 reference for the KL term as in alfworld_grpo_gpu.yaml) on 16 rows of
   2,048 prompt + 512 response tokens packed by `learner.max_tokens_per_micro_batch`: with gradient
   checkpointing at the GPU config's 32,768-token budget, and without it at 10,240 (4 rows); the
   checkpointed worker is kept for 4-6.
4. `weightsync_send_1.7b`: `LearnerWorker.join_weight_group` on a one-member group (ProcessGroupNCCL;
   gloo on CPU) and `LearnerWorker.broadcast_weights` of the 1.7B weights in bf16 buckets of 256 MB:
   header, bucket packing and the collective on the sender, NOT link bandwidth (that needs two GPUs).
5. `weightsync_ipc_1.7b`: the same protocol (`send_weights` / `receive_weights`) into
   `HFEngine.receive_weights` in a second process on the same GPU, over CUDA IPC (shared memory on
   CPU) through the thin transport in bench/gpu_sync.py (the one part that is not project code; see
   there). The engine's weights are zeroed first; reported: per-parameter checksums equal to the
   learner's bf16 weights, and the engine's log-probs of a fixed batch before and after vs the
   learner's (`LearnerWorker.score`).
6. `engine_vs_learner_bf16`: the synced engine samples 8 responses of up to 256 tokens at temperature
   1 (`HFEngine.generate_seeded`, bf16 weights, KV cache) and the learner scores the same tokens
   (`LearnerWorker.score`, fp32 weights under bf16 autocast): the teacher-forced log-prob gap as
   `learner.mismatch` computes it (mean / max |diff|, Pearson, k3 KL).
7. `colocate_release_1.7b`: colocated placement's two phases on one device (bench/gpu_colocate.py):
   an engine-sized allocation (`HFEngine` with the bf16 weights + a 16 GiB KV-sized buffer) beside
   the learner kept from 3; the learner's state offloaded (`learner.offload.LearnerOffload`), then
   the engine released (`HFEngine.sleep`) and the learner reloaded: device memory in each state
   and the seconds of each move.
8. `colocate_handover_1.7b`: the in-place handover of the 1.7B bf16 weights by CUDA IPC handles
   (`ColocatedLearner.export_handover`, `weightsync.ipc`) into `HFEngine.receive_handover` in a
   second process on the same GPU, then `release_handover`; checksums equal to the learner's.
9. `learner_train_1.7b_lora`: 3's checkpointed step with LoRA adapters (rank 64 on every projection,
   `learner.lora`; the KL reference is the base with the adapters disabled, no copy) when peft
   imports, else "skipped: peft missing": the learner's device memory against 3's.
10. `learner_train_1.7b_deepspeed`: 3's checkpointed step with `DeepSpeedBackend` (ZeRO-2, bf16) when
   deepspeed imports, else "skipped: deepspeed missing".
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import json
import os
import platform
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts: less fragmentation

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

import gpu_colocate
from gpu_model import EOS_ID, QWEN3_1P7B, QWEN25_7B, TINY_1P7B, TINY_7B, Shape, hf_model, write_model_dir
from gpu_sync import EngineJob, IpcSender, checksums, result, shareable_cuda_memory, start_engine_process

from learner.batch import collate_rows
from learner.config import LearnerConfig
from learner.logprobs import chunked_logprobs, logprobs_from_logits, response_logprobs
from learner.mismatch import mismatch
from learner.types import TrainRow
from weightsync.group import GroupSpec
from weightsync.protocol import send_weights
from weightsync.stream import parameter_stream

GIB = 1024**3


@dataclass(frozen=True)
class Workload:
    small: Shape
    large: Shape
    rows: int
    prompt: int
    response: int
    budget_ckpt: int  # learner.max_tokens_per_micro_batch with gradient checkpointing
    budget_full: int  # ... without it
    steps: int
    row_7b: int
    bucket_mb: int
    chunk: int  # learner.logprob_chunk_size of the log-prob comparison
    gen_prompts: int
    gen_prompt_len: int
    gen_tokens: int
    kv_bytes: int  # the KV-cache-sized buffer of colocate_release
    deadline_scale: float  # 0: a tiny run skips for time only when the budget has run out
    lora_rank: int = 64  # learner_train_1.7b_lora's adapters (the LoRA GPU configs' rank)


GPU = Workload(QWEN3_1P7B, QWEN25_7B, rows=16, prompt=2048, response=512, budget_ckpt=32_768, budget_full=10_240,
               steps=2, row_7b=6656, bucket_mb=256, chunk=1024, gen_prompts=8, gen_prompt_len=512, gen_tokens=256,
               kv_bytes=16 * 1024**3, deadline_scale=1.0)
TINY = Workload(TINY_1P7B, TINY_7B, rows=4, prompt=48, response=16, budget_ckpt=128, budget_full=64, steps=1,
                row_7b=96, bucket_mb=1, chunk=16, gen_prompts=2, gen_prompt_len=16, gen_tokens=8,
               kv_bytes=1 << 20, deadline_scale=0.0, lora_rank=4)


class Meter:
    """Peak memory: the device's allocator peak on CUDA, the process's max RSS elsewhere."""

    def __init__(self, device: torch.device):
        self.device = device
        self.source = "cuda max_memory_allocated" if device.type == "cuda" else "process max RSS (never resets)"

    def reset(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def current_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / GIB
        return 0.0

    def peak_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GIB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


@dataclass
class Session:
    """What the measurements share: the device, the workload, the 1.7B model directory, and the
    checkpointed learner (kept from `learner_train_1.7b_ckpt` for the sync and gap measurements)."""

    device: torch.device
    work: Workload
    meter: Meter
    model_dir: Path
    worker: Any = None
    handoff: dict[str, Any] = field(default_factory=dict)

    def learner(self):
        if self.worker is None:
            raise RuntimeError("no learner: learner_train_1.7b_ckpt did not finish")
        return self.worker


def _timed(meter: Meter, fn: Callable[[], Any]) -> tuple[Any, float]:
    meter.sync()
    t0 = time.perf_counter()
    out = fn()
    meter.sync()
    return out, time.perf_counter() - t0


def _ids(gen: torch.Generator, vocab: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(1, vocab, (n,), generator=gen).tolist())  # 0 is EOS


def train_rows(vocab: int, *, rows: int, prompt: int, response: int, seed: int) -> list[TrainRow]:
    """GRPO rows of random ids: groups of 4 with alternating outcomes (non-zero advantages)."""
    gen = torch.Generator().manual_seed(seed)
    return [TrainRow(prompt_ids=_ids(gen, vocab, prompt), response_ids=_ids(gen, vocab, response),
                     sampler_logprobs=(0.0,) * response, group_id=f"g{i // 4}", traj_id=f"t{i}", step_idx=0,
                     episode_score=float(i % 2), action_valid=True) for i in range(rows)]


def learner_config(*, checkpointing: bool, budget: int, deepspeed: bool, rows: int, lora_rank: int = 0) -> LearnerConfig:
    """`lora_rank` > 0: LoRA adapters of that rank (alpha 2 x rank, as the LoRA GPU configs)."""
    lora = {"enabled": True, "rank": lora_rank, "alpha": 2.0 * lora_rank} if lora_rank else {"enabled": False}
    return LearnerConfig(use_deepspeed=deepspeed, zero_stage=2 if deepspeed else 0, dtype="bfloat16",
                         gradient_checkpointing=checkpointing, max_tokens_per_micro_batch=budget,
                         micro_batch_rows=rows, kl_coef=0.01, lr=1e-6, lora=lora)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# measurements


def logprob_memory(ctx: Session, *, mode: str) -> dict:
    s, dev, meter = ctx.work.small, ctx.device, ctx.meter
    positions = ctx.work.rows * ctx.work.response
    meter.reset()
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(positions, s.hidden, generator=gen).to(dev, torch.bfloat16).requires_grad_(True)
    weight = (0.02 * torch.randn(s.vocab, s.hidden, generator=gen)).to(dev, torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, s.vocab, (positions,), generator=gen).to(dev)
    meter.sync()
    base = meter.current_gib()
    meter.reset()

    def run() -> torch.Tensor:
        if mode == "full":
            logp = logprobs_from_logits(F.linear(hidden, weight).float(), targets)
        else:
            logp = chunked_logprobs(hidden, weight, targets, chunk_size=ctx.work.chunk)[0]
        logp.sum().backward()
        return logp

    logp, seconds = _timed(meter, run)
    ctx.handoff[f"logprobs_{mode}"] = (logp.detach().float().cpu(), hidden.grad.detach().float().cpu())
    out = {"positions": positions, "inputs_gib": base, "peak_gib": meter.peak_gib(),
           "extra_gib": meter.peak_gib() - base, "seconds": seconds, "mean_logp": float(logp.detach().mean())}
    if mode == "chunked" and "logprobs_full" in ctx.handoff:
        (full, full_grad), (ours, grad) = ctx.handoff.pop("logprobs_full"), ctx.handoff.pop("logprobs_chunked")
        out |= {"max_abs_diff": float((full - ours).abs().max()), "max_abs_grad_diff": float((full_grad - grad).abs().max())}
    return out


def fwd_bwd_7b(ctx: Session, *, checkpointing: bool) -> dict:
    w, meter = ctx.work, ctx.meter
    meter.reset()
    model = hf_model(w.large, device=ctx.device, dtype=torch.bfloat16)
    if checkpointing:  # as learner.backends configures it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = collate_rows(train_rows(w.large.vocab, rows=1, prompt=w.row_7b - w.response, response=w.response, seed=1),
                         pad_token_id=EOS_ID)
    weights_gib = meter.current_gib()

    def step() -> None:
        response_logprobs(model, batch, temperature=1.0).logp.mean().backward()
        model.zero_grad(set_to_none=True)

    times = [_timed(meter, step)[1] for _ in range(w.steps)]
    return {"params_b": sum(p.numel() for p in model.parameters()) / 1e9, "weights_gib": weights_gib,
            "peak_gib": meter.peak_gib(), "step_s": min(times), "first_step_s": times[0],
            "tokens_per_s": w.row_7b / min(times)}


def learner_train(ctx: Session, *, checkpointing: bool, deepspeed: bool = False, keep: bool = False,
                  lora: bool = False) -> dict:
    from learner.worker import LearnerWorker

    w, meter = ctx.work, ctx.meter
    meter.reset()
    held = meter.current_gib()
    cfg = learner_config(checkpointing=checkpointing, budget=w.budget_ckpt if checkpointing else w.budget_full,
                         deepspeed=deepspeed, rows=w.rows, lora_rank=w.lora_rank if lora else 0)
    worker, load_s = _timed(meter, lambda: LearnerWorker(cfg, str(ctx.model_dir), master_port=_free_port()))
    rows = train_rows(w.small.vocab, rows=w.rows, prompt=w.prompt, response=w.response, seed=0)
    runs = [_timed(meter, lambda: worker.train_step(rows)) for _ in range(w.steps)]
    metrics, times = runs[-1][0], [t for _, t in runs]
    if keep:
        ctx.worker = worker
    return {"backend": type(worker.backend).__name__, "load_s": load_s, "held_before_gib": held,
            "peak_gib": meter.peak_gib(), "step_s": min(times), "first_step_s": times[0],
            "tokens_per_s": w.rows * (w.prompt + w.response) / min(times), "loss": metrics.loss,
            "grad_norm": metrics.grad_norm, "stages_s": metrics.seconds.model_dump(),
            "trainable_params": sum(p.numel() for p in worker.backend.module.parameters() if p.requires_grad)}


def weightsync_send(ctx: Session, *, store_dir: Path) -> dict:
    worker, meter = ctx.learner(), ctx.meter
    meter.reset()
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    spec = GroupSpec(name=f"gpu-check-send-{time.monotonic_ns()}", members=("learner",), timeout_s=120.0,
                     store_file=str(store_dir / "weightsync.store"), backend=backend)
    worker.join_weight_group(spec)
    send = lambda: worker.broadcast_weights(wire_dtype="bfloat16", bucket_mb=ctx.work.bucket_mb)
    runs = [_timed(meter, send) for _ in range(2)]
    sent, seconds = runs[0][0], min(t for _, t in runs)
    return {"backend": backend, "world_size": 1, "bytes": sent, "seconds": seconds, "first_s": runs[0][1],
            "gb_per_s": sent / seconds / 1e9, "peak_gib": meter.peak_gib()}


def _score_rows(ctx: Session) -> list[TrainRow]:
    w = ctx.work
    return train_rows(w.small.vocab, rows=2, prompt=w.gen_prompt_len, response=w.gen_tokens // 4, seed=3)


def _padded(values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(v) for v in values)
    out, mask = torch.zeros(len(values), width), torch.zeros(len(values), width)
    for i, v in enumerate(values):
        out[i, : len(v)], mask[i, : len(v)] = torch.tensor(v), 1.0
    return out, mask


def _engine_job(ctx: Session) -> EngineJob:
    w = ctx.work
    gen = torch.Generator().manual_seed(4)
    prompts = [list(_ids(gen, w.small.vocab, w.gen_prompt_len)) for _ in range(w.gen_prompts)]
    return EngineJob(model_dir=str(ctx.model_dir), device=ctx.device.type,
                     score_batch=collate_rows(_score_rows(ctx), pad_token_id=EOS_ID), prompts=prompts,
                     max_tokens=w.gen_tokens, seeds=list(range(w.gen_prompts)))


def weightsync_ipc(ctx: Session) -> dict:
    worker, meter = ctx.learner(), ctx.meter
    meter.reset()
    job = _engine_job(ctx)
    learner_logp, mask = _padded(worker.score(_score_rows(ctx)))
    child, channel = start_engine_process(job)
    try:
        loaded = result(channel, child, timeout_s=300, what="loading the engine")
        group = IpcSender("nccl" if ctx.device.type == "cuda" else "gloo", channel, child, timeout_s=120.0)
        metas, stream = parameter_stream(worker.backend.module, dtype=torch.bfloat16)
        with shareable_cuda_memory(ctx.device):
            stats, send_s = _timed(meter, lambda: send_weights(group, metas, stream,
                                                                bucket_bytes=ctx.work.bucket_mb << 20))
        got = result(channel, child, timeout_s=120, what="receiving the weights")
        ctx.handoff["generated"] = result(channel, child, timeout_s=300, what="sampling")
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.kill()
    sent_sums = checksums(worker.backend.module, torch.bfloat16)
    gap = lambda logp: float(((logp - learner_logp).abs() * mask).max())
    return {"transport": "CUDA IPC" if ctx.device.type == "cuda" else "shared memory", "tensors": stats.tensors,
            "buckets": stats.buckets, "bytes": stats.bytes, "send_receive_s": send_s, "receiver_s": got["receive_s"],
            "gb_per_s": stats.bytes / send_s / 1e9, "engine_load_s": loaded["load_s"],
            "tensors_loaded": got["tensors"], "checksums_equal": got["checksums"] == sent_sums,
            "logp_max_abs_diff_before": gap(loaded["logp_before"]), "logp_max_abs_diff_after": gap(got["logp_after"]),
            "peak_gib": meter.peak_gib()}


def engine_vs_learner(ctx: Session) -> dict:
    generated = ctx.handoff.pop("generated", None)
    if generated is None:
        raise RuntimeError("no engine samples: weightsync_ipc_1.7b did not finish")
    job = _engine_job(ctx)
    rows = [TrainRow(prompt_ids=tuple(p), response_ids=tuple(ids), sampler_logprobs=tuple(lps), group_id="g",
                     traj_id=f"t{i}", step_idx=0, episode_score=0.0, action_valid=True)
            for i, (p, ids, lps) in enumerate(zip(job.prompts, generated["token_ids"], generated["logprobs"],
                                                  strict=True))]
    engine_logp, mask = _padded([list(r.sampler_logprobs) for r in rows])
    learner_scores, seconds = _timed(ctx.meter, lambda: ctx.learner().score(rows))
    learner_logp, _ = _padded(learner_scores)
    return {"responses": len(rows), "tokens": int(mask.sum()), "generate_s": generated["generate_s"],
            "score_s": seconds, **mismatch(engine_logp, learner_logp, mask)}


# ----------------------------------------------------------------------------------------------
# running, reporting


@dataclass(frozen=True)
class Measurement:
    name: str
    exercises: tuple[str, ...]
    config: dict
    run: Callable[[], dict]
    needs_s: float  # at most on an H200 (a wide margin)
    requires: str | None = None  # a module whose absence skips it


def _missing(module: str | None) -> bool:
    if module is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - absent or broken: skipped, not failed
        return True
    return False


def _run(results: list[dict], m: Measurement, *, deadline: float, scale: float, save: Callable[[], None]) -> None:
    entry: dict[str, Any] = {"name": m.name, "exercises": list(m.exercises), "config": m.config}
    if time.monotonic() + m.needs_s * scale > deadline:
        entry.update(status="skipped", error=f"time budget: needs ~{m.needs_s:.0f} s")
    elif _missing(m.requires):
        entry.update(status="skipped", error=f"skipped: {m.requires} missing")
    else:
        t0 = time.monotonic()
        try:
            entry.update(status="ok", **m.run())
        except torch.OutOfMemoryError as err:
            entry.update(status="oom", error=str(err).splitlines()[0][:300])
        except Exception as err:  # noqa: BLE001 - one failed measurement must not lose the others
            entry.update(status="error", error=f"{type(err).__name__}: {str(err)[:300]}")
        entry["wall_s"] = time.monotonic() - t0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    results.append(entry)
    save()  # what ran so far survives a later hang or kill
    print(f"[gpu_check] {m.name}: {entry['status']} ({entry.get('wall_s', 0):.1f} s)", flush=True)


def measurements(ctx: Session, store_dir: Path) -> list[Measurement]:
    w = ctx.work
    lp = "learner.logprobs."
    train = "learner.worker.LearnerWorker.train_step"
    rows = {"shape": w.small.name, "rows": w.rows, "prompt": w.prompt, "response": w.response, "steps": w.steps,
            "dtype": "bfloat16", "kl_coef": 0.01}
    out = [Measurement(f"logprobs_{mode}", (lp + ("logprobs_from_logits" if mode == "full" else "chunked_logprobs"),),
                       {"shape": w.small.name, "positions": w.rows * w.response, "vocab": w.small.vocab,
                        "chunk_size": w.chunk},
                       lambda mode=mode: logprob_memory(ctx, mode=mode), needs_s=30)
           for mode in ("full", "chunked")]
    out += [Measurement(f"fwd_bwd_7b_{'ckpt' if ckpt else 'full'}", (lp + "response_logprobs",),
                        {"shape": w.large.name, "tokens": w.row_7b, "logprob_positions": w.response,
                         "checkpointing": ckpt, "weights": "bf16", "steps": w.steps},
                        lambda ckpt=ckpt: fwd_bwd_7b(ctx, checkpointing=ckpt), needs_s=60) for ckpt in (False, True)]
    out += [Measurement(f"learner_train_1.7b_{'ckpt' if ckpt else 'full'}", (train, "learner.backends.TorchBackend"),
                        {**rows, "checkpointing": ckpt, "max_tokens_per_micro_batch": w.budget_ckpt if ckpt else w.budget_full},
                        lambda ckpt=ckpt: learner_train(ctx, checkpointing=ckpt, keep=ckpt), needs_s=60)
            for ckpt in (False, True)]
    out += [
        Measurement("weightsync_send_1.7b", ("learner.worker.LearnerWorker.join_weight_group",
                                             "learner.worker.LearnerWorker.broadcast_weights",
                                             "weightsync.protocol.send_weights"),
                    {"shape": w.small.name, "bucket_mb": w.bucket_mb, "wire_dtype": "bfloat16",
                     "what": "1-member group: header, packing and collective on the sender, not link bandwidth"},
                    lambda: weightsync_send(ctx, store_dir=store_dir), needs_s=20),
        Measurement("weightsync_ipc_1.7b", ("weightsync.stream.parameter_stream", "weightsync.protocol.send_weights",
                                            "weightsync.protocol.receive_weights",
                                            "rollout_workers.engines.hf_engine.HFEngine.receive_weights",
                                            "learner.worker.LearnerWorker.score"),
                    {"shape": w.small.name, "bucket_mb": w.bucket_mb, "wire_dtype": "bfloat16",
                     "not_project_code": "bench/gpu_sync.py: the hand-off of each broadcast tensor to the 2nd process"},
                    lambda: weightsync_ipc(ctx), needs_s=120),
        Measurement("engine_vs_learner_bf16", ("rollout_workers.engines.hf_engine.HFEngine.generate_seeded",
                                               "learner.worker.LearnerWorker.score", "learner.mismatch.mismatch"),
                    {"shape": w.small.name, "prompts": w.gen_prompts, "prompt": w.gen_prompt_len,
                     "max_tokens": w.gen_tokens, "temperature": 1.0, "engine": "HFEngine bf16",
                     "learner": "TorchBackend fp32 weights, bf16 autocast"},
                    lambda: engine_vs_learner(ctx), needs_s=30),
    ]

    out += [
        Measurement("colocate_release_1.7b", ("learner.offload.LearnerOffload.offload",
                                              "learner.offload.LearnerOffload.reload",
                                              "rollout_workers.engines.hf_engine.HFEngine.sleep",
                                              "rollout_workers.engines.hf_engine.HFEngine.wake_up"),
                    {"shape": w.small.name, "kv_gib": w.kv_bytes / GIB, "engine": "HFEngine bf16",
                     "learner": "TorchBackend fp32 weights + AdamW state + bf16 reference"},
                    lambda: gpu_colocate.release(ctx.learner(), str(ctx.model_dir), ctx.device, kv_bytes=w.kv_bytes),
                    needs_s=60),
        Measurement("colocate_handover_1.7b", ("learner.colocation.ColocatedLearner.export_handover",
                                               "learner.colocation.ColocatedLearner.release_handover",
                                               "weightsync.ipc.open_handover",
                                               "rollout_workers.engines.hf_engine.HFEngine.receive_handover"),
                    {"shape": w.small.name, "bucket_mb": w.bucket_mb, "wire_dtype": "bfloat16",
                     "processes": "learner here, engine in a second process on the same device"},
                    lambda: gpu_colocate.handover(ctx.learner(), str(ctx.model_dir), ctx.device,
                                                  bucket_mb=w.bucket_mb), needs_s=120),
    ]

    def lora_step() -> dict:
        ctx.worker = None  # the full-weight learner's memory goes first
        return learner_train(ctx, checkpointing=True, lora=True)

    out.append(Measurement("learner_train_1.7b_lora", (train, "learner.lora.apply_lora",
                                                       "learner.lora.adapters_disabled"),
                           {**rows, "checkpointing": True, "max_tokens_per_micro_batch": w.budget_ckpt,
                            "lora_rank": w.lora_rank}, lora_step, needs_s=60, requires="peft"))

    def deepspeed_step() -> dict:
        ctx.worker = None  # the torch learner's memory goes first
        return learner_train(ctx, checkpointing=True, deepspeed=True)

    out.append(Measurement("learner_train_1.7b_deepspeed", (train, "learner.backends.DeepSpeedBackend"),
                           {**rows, "checkpointing": True, "max_tokens_per_micro_batch": w.budget_ckpt,
                            "zero_stage": 2}, deepspeed_step, needs_s=120, requires="deepspeed"))
    return out


def _versions() -> dict:
    found = {"torch": torch.__version__, "python": platform.python_version()}
    for mod in ("transformers", "tokenizers", "pydantic", "accelerate", "peft", "deepspeed"):
        try:
            found[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: the check runs without it
            found[mod] = None
    return found


def _table(results: list[dict]) -> str:
    head = f"{'measurement':<30} {'status':<8} {'peak GiB':>9} {'tokens/s':>10} {'seconds':>8}  notes"
    lines = [head, "-" * len(head)]
    notes = ("gb_per_s", "extra_gib", "max_abs_diff", "checksums_equal", "logp_max_abs_diff_after",
             "engine_released_gib", "learner_offloaded_gib",
             "mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max")
    for r in results:
        secs = r.get("step_s", r.get("seconds", r.get("send_receive_s", r.get("score_s"))))
        note = r.get("error") or ", ".join(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                                            for k in notes if k in r)
        lines.append(f"{r['name']:<30} {r['status']:<8} {r.get('peak_gib', float('nan')):>9.2f} "
                     f"{r.get('tokens_per_s', float('nan')):>10.0f} {secs if secs is not None else float('nan'):>8.3f}"
                     f"  {note}")
    return "\n".join(lines)


def _setup(work: Workload, device: torch.device, model_dir: Path) -> dict:
    t0 = time.perf_counter()
    write_model_dir(work.small, model_dir, device=device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"model_dir_s": time.perf_counter() - t0, "shape": work.small.name,
            "params_b": work.small.num_params() / 1e9}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (CI)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON path (default bench/results/gpu_check.json; --tiny: TMPDIR/gpu_check_tiny.json)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="skip measurements that would end after this")
    args = ap.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    dev = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if not args.tiny and dev.type != "cuda":
        ap.error("no CUDA device: run with --tiny on CPU")
    # a tiny run's numbers mean nothing: by default they stay out of bench/results
    out = args.out or (Path(tempfile.gettempdir()) / "gpu_check_tiny.json" if args.tiny
                       else ROOT / "bench" / "results" / "gpu_check.json")
    work = TINY if args.tiny else GPU
    meter = Meter(dev)
    results: list[dict] = []
    report: dict[str, Any] = {
        "check": "gpu_check", "tiny": args.tiny, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "versions": _versions(), "peak_memory": meter.source, "budget_s": args.budget_s, "complete": False,
        "wall_s": 0.0, "setup": {}, "measurements": results,
    }

    def save() -> None:
        report["wall_s"] = time.monotonic() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")

    # A hung collective or kernel must not eat the machine's time: dump the stacks and exit.
    faulthandler.dump_traceback_later(args.budget_s + 50, exit=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        ctx = Session(dev, work, meter, Path(tmp) / "model")
        report["setup"] = _setup(work, dev, ctx.model_dir)
        for m in measurements(ctx, Path(tmp)):
            _run(results, m, deadline=deadline, scale=work.deadline_scale, save=save)
        ctx.worker = None
    faulthandler.cancel_dump_traceback_later()
    report["complete"] = True
    save()
    print(_table(results))
    print(f"gpu check: {sum(r['status'] == 'ok' for r in results)}/{len(results)} measurements ok, "
          f"{report['wall_s']:.0f} s, json {out}")
    return report


if __name__ == "__main__":
    main()
