"""A GPU check for the first GPU (one H200, under 8 minutes). Needs torch alone.

    python bench/gpu_check.py                      # on the GPU: table + bench/results/gpu_check.json
    python bench/gpu_check.py --tiny --out X.json  # the same code on CPU with tiny shapes (CI)
    timeout 560 python bench/gpu_check.py --out "$OUT/gpu_check.json"   # on the lent device machine

Models are random-init Qwen3-1.7B / Qwen2.5-7B shapes written in code (bench/gpu_model.py):
transformers builds them when it imports, else a plain-torch decoder of the same architecture.
No vLLM, no Ray, no hub, no network. Measurements (each records its own peak device memory, or
the process's peak RSS on CPU, which only grows; an out-of-memory error is recorded and the next
measurement runs; a time budget skips what would start too late):

1. `train_1.7b_{full,ckpt}`: one learner-style training step at 1.7B on 8 rows of 2,048 prompt +
   512 response tokens, without and with gradient checkpointing: fp32 weights under bf16 autocast
   (as `learner.backends.TorchBackend`), forward to the final hidden states, response log-probs
   with `learner.logprobs.chunked_logprobs` (no entropy), a PPO-style ratio loss, backward, one
   AdamW step. 8 rows per micro-batch (the old fixed `micro_batch_rows`): the worst case the
   token-budget micro-batches avoid. Not DeepSpeed (ZeRO shards nothing on one GPU; its bf16
   optimiser keeps the same 16 bytes per parameter).
2. `fwd_bwd_7b_{full,ckpt}`: bf16 7B forward + backward on one 6,656-token row (log-probs of its
   last 512 tokens), no optimiser.
3. `logprobs_{full,chunked}`: memory above the inputs of forward + backward of the response
   log-probs of that step (8 x 512 = 4,096 positions) at the 1.7B head (151,936 x 2,048): full
   fp32 logits vs chunked; and the largest difference between the two (log-probs and gradients).
4. `broadcast_bf16`: seconds and GB/s to send the 1.7B weights in bf16 buckets of 512 MB through
   `torch.distributed.broadcast` of a process group (NCCL on a GPU, gloo on CPU) with ONE rank:
   bucket packing + collective launch and completion on the sender's side, NOT link bandwidth,
   which needs two GPUs (the weight-sync benchmark on CPU and a multi-GPU run measure that).

`chunked_impl` in the JSON says which chunked log-prob function ran: `learner.logprobs` when it
imports (it needs pydantic through learner.types), else `bench fallback`, a local equivalent.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts: less fragmentation

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

from gpu_model import QWEN3_1P7B, QWEN25_7B, TINY_1P7B, TINY_7B, Shape, build_model

GIB = 1024**3


def _load_chunked() -> tuple[Callable, str]:
    try:
        from learner.logprobs import chunked_logprobs

        return chunked_logprobs, "learner.logprobs"
    except ImportError:
        return _fallback_chunked, "bench fallback"


def _fallback_chunked(hidden, weight, targets, *, temperature=1.0, chunk_size=1024, with_entropy=False):
    """log p(targets) chunk by chunk, each chunk checkpointed so backward recomputes its logits."""
    from torch.utils.checkpoint import checkpoint

    def one(h, t):
        logits = F.linear(h.to(weight.dtype), weight).float() / temperature
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    parts = [checkpoint(one, hidden[i:i + chunk_size], targets[i:i + chunk_size], use_reentrant=False)
             if torch.is_grad_enabled() else one(hidden[i:i + chunk_size], targets[i:i + chunk_size])
             for i in range(0, hidden.shape[0], chunk_size)]
    return torch.cat(parts), None


def _full_logprobs(hidden, weight, targets):
    logits = F.linear(hidden.to(weight.dtype), weight).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


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


def _free() -> None:
    """After a measurement returned (its tensors went with its frame): hand cached blocks back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_step(shape: Shape, *, rows: int, prompt: int, response: int, checkpointing: bool, meter: Meter,
               chunked: Callable, steps: int, prefer_hf: bool) -> dict:
    dev = meter.device
    meter.reset()
    model, impl = build_model(shape, device=dev, dtype=torch.float32, prefer_hf=prefer_hf)
    model.set_checkpointing(checkpointing)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, shape.vocab, (rows, prompt + response), generator=gen).to(dev)
    adv = torch.randn(rows, 1, generator=gen).to(dev)
    times = []
    for _ in range(steps):
        meter.sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            h = model.hidden(ids[:, :-1])[:, -response:]  # positions predicting the response
            logp, _ = chunked(h.reshape(-1, h.shape[-1]), model.head_weight(), ids[:, -response:].reshape(-1))
        logp = logp.view(rows, response)
        ratio = torch.exp(logp - logp.detach())
        loss = -(ratio * adv).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.sync()
        times.append(time.perf_counter() - t0)
    tokens = rows * (prompt + response)
    out = {"impl": impl, "params_b": sum(p.numel() for p in model.parameters()) / 1e9, "peak_gib": meter.peak_gib(),
           "step_s": min(times), "first_step_s": times[0], "tokens_per_s": tokens / min(times),
           "loss": float(loss.detach())}
    return out


def fwd_bwd(shape: Shape, *, length: int, response: int, checkpointing: bool, meter: Meter, chunked: Callable,
            steps: int, prefer_hf: bool) -> dict:
    dev = meter.device
    meter.reset()
    model, impl = build_model(shape, device=dev, dtype=torch.bfloat16, prefer_hf=prefer_hf)
    model.set_checkpointing(checkpointing)
    model.train()
    ids = torch.randint(0, shape.vocab, (1, length), generator=torch.Generator().manual_seed(1)).to(dev)
    weights_gib = meter.current_gib()
    times = []
    for _ in range(steps):
        meter.sync()
        t0 = time.perf_counter()
        h = model.hidden(ids[:, :-1])[0, -response:]
        logp, _ = chunked(h, model.head_weight(), ids[0, -response:])
        logp.mean().backward()
        model.zero_grad(set_to_none=True)
        meter.sync()
        times.append(time.perf_counter() - t0)
    out = {"impl": impl, "params_b": sum(p.numel() for p in model.parameters()) / 1e9, "weights_gib": weights_gib,
           "peak_gib": meter.peak_gib(), "step_s": min(times), "first_step_s": times[0],
           "tokens_per_s": length / min(times)}
    return out


def logprob_memory(shape: Shape, *, positions: int, chunked: Callable, meter: Meter, mode: str) -> dict:
    dev = meter.device
    meter.reset()
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(positions, shape.hidden, generator=gen).to(dev, torch.bfloat16).requires_grad_(True)
    weight = (0.02 * torch.randn(shape.vocab, shape.hidden, generator=gen)).to(dev, torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, shape.vocab, (positions,), generator=gen).to(dev)
    meter.sync()
    base = meter.current_gib()
    meter.reset()
    t0 = time.perf_counter()
    logp = _full_logprobs(hidden, weight, targets) if mode == "full" else chunked(hidden, weight, targets)[0]
    logp.sum().backward()
    meter.sync()
    out = {"inputs_gib": base, "peak_gib": meter.peak_gib(), "extra_gib": meter.peak_gib() - base,
           "seconds": time.perf_counter() - t0, "mean_logp": float(logp.detach().float().mean()),
           "_logp": logp.detach().float().cpu(), "_grad": hidden.grad.detach().float().cpu()}
    return out


def broadcast(shape: Shape, *, bucket_mb: int, meter: Meter, repeats: int) -> dict:
    import datetime

    import torch.distributed as dist

    dev = meter.device
    meter.reset()
    backend = "nccl" if dev.type == "cuda" else "gloo"
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    try:
        model, _ = build_model(shape, device=dev, dtype=torch.bfloat16, prefer_hf=False)
        params = [p.detach() for p in model.parameters()]
        total = sum(p.numel() * p.element_size() for p in params)
        bucket_bytes = bucket_mb * 1024**2
        buf = torch.empty(bucket_bytes // 2, dtype=torch.bfloat16, device=dev)
        times = []
        for _ in range(repeats):
            meter.sync()
            t0 = time.perf_counter()
            fill = 0
            for p in params:
                flat = p.reshape(-1)
                start = 0
                while start < flat.numel():
                    take = min(flat.numel() - start, buf.numel() - fill)
                    buf[fill:fill + take].copy_(flat[start:start + take])
                    fill, start = fill + take, start + take
                    if fill == buf.numel():
                        dist.broadcast(buf, src=0)
                        fill = 0
            if fill:
                dist.broadcast(buf[:fill], src=0)
            meter.sync()
            times.append(time.perf_counter() - t0)
        out = {"backend": backend, "world_size": 1, "bytes": total, "bucket_mb": bucket_mb, "seconds": min(times),
               "gb_per_s": total / min(times) / 1e9, "peak_gib": meter.peak_gib()}
        return out
    finally:
        dist.destroy_process_group()


def _run(results: list[dict], name: str, config: dict, fn: Callable[[], dict], *, deadline: float,
         needs_s: float, save: Callable[[], None]) -> None:
    entry = {"name": name, "config": config}
    if time.monotonic() + needs_s > deadline:
        entry.update(status="skipped", error=f"time budget: needs ~{needs_s:.0f} s")
    else:
        t0 = time.monotonic()
        try:
            entry.update(status="ok", **fn())
        except torch.OutOfMemoryError as err:
            entry.update(status="oom", error=str(err).splitlines()[0][:300])
        except Exception as err:  # noqa: BLE001 - one failed measurement must not lose the others
            entry.update(status="error", error=f"{type(err).__name__}: {str(err)[:300]}")
        entry["wall_s"] = time.monotonic() - t0
        _free()
    results.append(entry)
    save()  # what ran so far survives a later hang or kill
    print(f"[gpu_check] {name}: {entry['status']} ({entry.get('wall_s', 0):.1f} s)", flush=True)


def _versions() -> dict:
    found = {"torch": torch.__version__}
    for mod in ("transformers", "deepspeed"):
        try:
            found[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: the check runs without it
            found[mod] = None
    return found


def _table(results: list[dict]) -> str:
    head = f"{'measurement':<20} {'status':<8} {'peak GiB':>9} {'tokens/s':>10} {'seconds':>8}  notes"
    lines = [head, "-" * len(head)]
    for r in results:
        secs = r.get("step_s", r.get("seconds"))
        note = r.get("error") or ", ".join(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                                            for k in ("impl", "gb_per_s", "extra_gib", "max_abs_diff") if k in r)
        lines.append(f"{r['name']:<20} {r['status']:<8} {r.get('peak_gib', float('nan')):>9.2f} "
                     f"{r.get('tokens_per_s', float('nan')):>10.0f} {secs if secs is not None else float('nan'):>8.3f}"
                     f"  {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (CI)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/gpu_check.json; --tiny: TMPDIR/gpu_check_tiny.json)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="skip measurements that would end after this")
    ap.add_argument("--impl", choices=("auto", "torch"), default="auto",
                    help="auto: transformers when it imports, else the plain-torch decoder; torch: always the latter")
    args = ap.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    dev = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if not args.tiny and dev.type != "cuda":
        ap.error("no CUDA device: run with --tiny on CPU")
    # a tiny run's numbers mean nothing: by default they stay out of bench/results
    out = args.out or (Path(tempfile.gettempdir()) / "gpu_check_tiny.json" if args.tiny
                       else ROOT / "bench" / "results" / "gpu_check.json")
    meter = Meter(dev)
    prefer_hf = args.impl == "auto"
    chunked, chunked_impl = _load_chunked()
    small, large = (TINY_1P7B, TINY_7B) if args.tiny else (QWEN3_1P7B, QWEN25_7B)
    rows, prompt, response = (2, 48, 16) if args.tiny else (8, 2048, 512)
    row7b = 96 if args.tiny else 6656
    steps = 1 if args.tiny else 2
    # seconds each needs at most on an H200 (estimates with a wide margin; CPU tiny runs are instant)
    need = (lambda s: 0.0) if args.tiny else (lambda s: s)
    results: list[dict] = []
    report = {
        "check": "gpu_check", "tiny": args.tiny, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "versions": _versions(), "chunked_impl": chunked_impl, "peak_memory": meter.source,
        "budget_s": args.budget_s, "complete": False, "wall_s": 0.0, "measurements": results,
    }

    def save() -> None:
        report["wall_s"] = time.monotonic() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**report, "measurements": [{k: v for k, v in r.items() if not k.startswith("_")}
                                                             for r in results]}, indent=2) + "\n")

    # A hung collective or kernel must not eat the machine's time: dump the stacks and exit.
    faulthandler.dump_traceback_later(args.budget_s + 50, exit=True)
    for ckpt in (False, True):
        _run(results, f"train_1.7b_{'ckpt' if ckpt else 'full'}",
             {"shape": small.name, "rows": rows, "prompt": prompt, "response": response, "checkpointing": ckpt,
              "micro_batch_rows": rows, "steps": steps, "weights": "fp32 + bf16 autocast", "optimizer": "AdamW"},
             lambda ckpt=ckpt: train_step(small, rows=rows, prompt=prompt, response=response, checkpointing=ckpt,
                                          meter=meter, chunked=chunked, steps=steps, prefer_hf=prefer_hf),
             deadline=deadline, needs_s=need(90), save=save)
    for ckpt in (False, True):
        _run(results, f"fwd_bwd_7b_{'ckpt' if ckpt else 'full'}",
             {"shape": large.name, "tokens": row7b, "logprob_positions": response, "checkpointing": ckpt,
              "weights": "bf16", "steps": steps},
             lambda ckpt=ckpt: fwd_bwd(large, length=row7b, response=response, checkpointing=ckpt, meter=meter,
                                       chunked=chunked, steps=steps, prefer_hf=prefer_hf),
             deadline=deadline, needs_s=need(90), save=save)
    positions = rows * response
    for mode in ("full", "chunked"):
        _run(results, f"logprobs_{mode}", {"shape": small.name, "positions": positions, "vocab": small.vocab,
                                           "dtype": "bf16 inputs, fp32 logits", "impl": chunked_impl},
             lambda mode=mode: logprob_memory(small, positions=positions, chunked=chunked, meter=meter, mode=mode),
             deadline=deadline, needs_s=need(30), save=save)
    lp = {r["name"]: r for r in results if r["name"].startswith("logprobs_") and r["status"] == "ok"}
    if len(lp) == 2:
        a, b = lp["logprobs_full"], lp["logprobs_chunked"]
        lp["logprobs_chunked"]["max_abs_diff"] = float((a["_logp"] - b["_logp"]).abs().max())
        lp["logprobs_chunked"]["max_abs_grad_diff"] = float((a["_grad"] - b["_grad"]).abs().max())
    for r in lp.values():
        r.pop("_logp"), r.pop("_grad")
    _run(results, "broadcast_bf16", {"shape": small.name, "bucket_mb": 512 if not args.tiny else 1,
                                     "what": "1-rank group: packing + collective on the sender, not link bandwidth"},
         lambda: broadcast(small, bucket_mb=1 if args.tiny else 512, meter=meter, repeats=2 if args.tiny else 3),
         deadline=deadline, needs_s=need(40), save=save)
    faulthandler.cancel_dump_traceback_later()
    report["complete"] = True
    save()
    print(_table(results))
    print(f"gpu check: {sum(r['status'] == 'ok' for r in results)}/{len(results)} measurements ok, "
          f"{report['wall_s']:.0f} s, json {out}")
    return report


if __name__ == "__main__":
    main()
