"""The GPU check's colocation measurements (bench/gpu_check.py 8 and 9), all project code:

- `colocate_release`: an engine-sized allocation on the device (`HFEngine` with the 1.7B bf16
  weights plus a KV-cache-sized buffer) beside the trained learner (`LearnerWorker`, TorchBackend,
  AdamW state allocated), then the two phases of colocated placement: the learner's state
  offloaded (`learner.offload.LearnerOffload.offload`) while the engine holds the device, then the
  engine released (`HFEngine.sleep`, the KV buffer dropped) and the learner reloaded. Reported: the
  device memory allocated in each state and the seconds of each move. vLLM's own sleep (CuMem
  allocator) is not installed on the device machine; `HFEngine.sleep` moves its weights to host
  memory the way vLLM's level 1 does.
- `colocate_handover`: the in-place handover of the 1.7B weights (bf16, 256 MiB buckets) from the
  learner (`ColocatedLearner.export_handover`: CUDA IPC handles, shared memory on CPU) into an
  `HFEngine` in a second process on the same device (`HFEngine.receive_handover`, its weights
  zeroed first), then `release_handover`; per-parameter checksums equal to the learner's.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.multiprocessing as mp
from gpu_sync import checksums, shareable_cuda_memory, wait_for

GIB = 1024**3


def _allocated(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) / GIB


def _timed(device: torch.device, fn) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def release(worker, model_dir: str, device: torch.device, *, kv_bytes: int) -> dict:
    """The device memory of both sides through one generate phase and one train phase."""
    from learner.offload import LearnerOffload
    from rollout_workers.config import EngineConfig
    from rollout_workers.engines.hf_engine import HFEngine

    learner_only = _allocated(device)
    engine = HFEngine(model_dir, EngineConfig(engine="hf", dtype="bfloat16", device=device.type))
    kv = torch.empty(kv_bytes, dtype=torch.uint8, device=device)
    both = _allocated(device)
    offload = LearnerOffload(worker.backend, worker.ref_model)
    offload_s = _timed(device, offload.offload)
    generate_phase = _allocated(device)

    def sleep() -> None:
        nonlocal kv
        engine.sleep(1)
        kv = None
        if device.type == "cuda":
            torch.cuda.empty_cache()

    sleep_s = _timed(device, sleep)
    reload_s = _timed(device, offload.reload)
    train_phase = _allocated(device)
    wake_s = _timed(device, lambda: engine.wake_up(["weights"]))  # the engine goes with this call (gpu_check frees)
    return {"kv_gib": kv_bytes / GIB, "learner_gib": learner_only, "engine_gib": both - learner_only,
            "allocated_gib": {"both_resident": both, "generate_phase": generate_phase, "train_phase": train_phase},
            "engine_released_gib": both - train_phase, "learner_offloaded_gib": both - generate_phase, "offload_s": offload_s, "reload_s": reload_s,
            "sleep_s": sleep_s, "wake_weights_s": wake_s}


def _receive(model_dir: str, device: str, inbox, outbox) -> None:
    try:
        from rollout_workers.config import EngineConfig
        from rollout_workers.engines.hf_engine import HFEngine

        engine = HFEngine(model_dir, EngineConfig(engine="hf", dtype="bfloat16", device=device))
        with torch.no_grad():
            for p in engine.model.parameters():
                p.zero_()
        outbox.put({"ready": True})
        handover = inbox.get()
        t0 = time.perf_counter()
        count = engine.receive_handover([handover])
        if device == "cuda":
            torch.cuda.synchronize()
        outbox.put({"tensors": count, "receive_s": time.perf_counter() - t0,
                    "checksums": checksums(engine.model, torch.bfloat16)})
    except BaseException as err:
        outbox.put({"error": f"{type(err).__name__}: {str(err)[:300]}"})
        raise


def _answer(outbox, child, *, what: str) -> dict:
    out = wait_for(outbox, child, timeout_s=300, what=what)
    if "error" in out:
        raise RuntimeError(f"engine process, {what}: {out['error']}")
    return out


def handover(worker, model_dir: str, device: torch.device, *, bucket_mb: int) -> dict[str, Any]:
    """The learner's weights handed in place to an engine in a second process on the same device."""
    from learner.colocation import ColocatedLearner

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receive, args=(model_dir, device.type, inbox, outbox), daemon=True)
    child.start()
    try:
        _answer(outbox, child, what="loading the engine")
        with shareable_cuda_memory(device):
            t0 = time.perf_counter()
            sent = ColocatedLearner.export_handover(worker, "bfloat16", bucket_mb)
            export_s = time.perf_counter() - t0
            inbox.put(sent)
            got = _answer(outbox, child, what="loading the handover")
            t1 = time.perf_counter()
            ColocatedLearner.release_handover(worker)
            release_s = time.perf_counter() - t1
            total_s = time.perf_counter() - t0
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.kill()
    return {"transport": "CUDA IPC" if device.type == "cuda" else "shared memory", "bytes": sent.nbytes,
            "chunks": len(sent.chunks), "slots": sent.slots, "tensors": sent.num_tensors, "tensors_loaded": got["tensors"],
            "export_s": export_s, "receive_s": got["receive_s"], "release_s": release_s, "seconds": total_s,
            "gb_per_s": sent.nbytes / total_s / 1e9,
            "checksums_equal": got["checksums"] == checksums(worker.backend.module, torch.bfloat16)}
