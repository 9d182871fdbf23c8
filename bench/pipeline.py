"""One-step-off pipeline vs the synchronous loop (docs/pipeline.md), side by side in one run: the
demo config (deploy/configs/demo_cpu.yaml) trained N steps with `rollout.max_staleness` 0 and then
1, both from the same SFT checkpoint (built once by the CLI and cached under --out), on local Ray.

Resources: the rollout worker and the learner each get one Ray CPU (`ray.rollout_cpus=1`,
`ray.learner_cpus=1`; an actor with num_cpus=1 runs one torch thread). Ray accounts CPUs, it does
not pin threads (no taskset): on a 2-core machine the two overlap only as far as the OS schedules
them on different cores, and anything else running on the machine competes with both.

Per mode it reports (from metrics.jsonl, steady state = steps 2..N, step 1 warms everything up):
  steps/hour          3600 / mean `time/step_s`
  learner idle        1 - (learn + sync export) / step time, the sync export being
                      `time/sync_s - async/sync_wait_s`
  staleness max       max `async/staleness_max`
  final Avg@k         the run's end-of-run evaluation on the fixed eval set (eval.split)

    .venv/bin/python bench/pipeline.py            # 8 steps per mode, the demo's eval set
    .venv/bin/python bench/pipeline.py --quick    # 3 steps per mode, 16 eval tasks, short SFT (< 10 min)

Writes bench/results/pipeline.json; the last line is
`async vs sync: X.XXx steps/hour, staleness max K, eval delta +-D`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deploy" / "configs" / "demo_cpu.yaml"
DEFAULT_OUT = ROOT / "bench" / "results" / "pipeline.json"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "DS_ACCELERATOR": "cpu",
                       "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                       "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}.items():
        env.setdefault(key, value)
    return env


def _deploy(*args: str) -> None:
    cmd = [sys.executable, "-m", "deploy", *args]
    print("$", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")


def sft_checkpoint(work: Path, *, max_steps: int | None, num_tasks: int) -> Path:
    """The demo's tiny model after its SFT cold start (`max_steps` optimiser steps, None: every
    planned step), built once (reused when present)."""
    base, sft = work / "base", work / f"sft_{num_tasks}x{max_steps or 'all'}steps"
    if not (sft / "config.json").is_file():
        if not (base / "config.json").is_file():
            _deploy("build-tiny-model", "--config", str(CONFIG), "--out", str(base))
        _deploy("sft", "--config", str(CONFIG), "--model", str(base), "--out", str(sft),
                "--num-tasks", str(num_tasks), *(["--max-steps", str(max_steps)] if max_steps else []))
    return sft


def summarize(run: Path, total_steps: int) -> dict:
    """Steady-state rates and the final evaluation of one finished run (pure: reads its files)."""
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steady = steps[1:] or steps
    step_s = sum(s["time/step_s"] for s in steady)
    busy = sum(s.get("time/learn_s", 0.0) + s.get("time/sync_s", 0.0) - s["async/sync_wait_s"] for s in steady)
    final = json.loads((run / "eval" / f"step_{total_steps:04d}.json").read_text())
    return {
        "steps": len(steps),
        "steady_steps": len(steady),
        "step_s_mean": step_s / len(steady),
        "steps_per_hour": 3600 * len(steady) / step_s,
        "learner_idle_fraction": 1 - busy / step_s,
        "learner_wait_s_mean": sum(s["async/learner_wait_s"] for s in steady) / len(steady),
        "sync_wait_s_mean": sum(s["async/sync_wait_s"] for s in steady) / len(steady),
        "rollout_s_mean": sum(s.get("time/rollout_s", 0.0) for s in steady) / len(steady),
        "learn_s_mean": sum(s.get("time/learn_s", 0.0) for s in steady) / len(steady),
        "staleness_max": max(int(s["async/staleness_max"]) for s in steps),
        "staleness_mean": sum(s["async/staleness_mean"] for s in steps) / len(steps),
        "success_rate_per_step": [s["success_rate"] for s in steps],
        "final_avg_at_k": final["avg_at_k"],
        "final_avg_at_k_se": final.get("avg_at_k_se"),
        "eval_k": final.get("k"),
        "eval_tasks": final.get("num_tasks"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps per mode, 16 eval tasks, a 1.5-minute SFT")
    parser.add_argument("--steps", type=int, default=None, help="training steps per mode (default 8; quick 3)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_pipeline")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 8)
    eval_tasks, sft_steps, sft_tasks = (16, 50, 100) if args.quick else (48, None, 300)
    start = time.perf_counter()
    model = sft_checkpoint(args.work, max_steps=sft_steps, num_tasks=sft_tasks)
    modes: dict[str, dict] = {}
    for k in (0, 1):
        run = args.work / f"{'quick_' if args.quick else ''}k{k}"
        shutil.rmtree(run, ignore_errors=True)  # train appends to an existing metrics.jsonl
        t0 = time.perf_counter()
        print(f"max_staleness={k}: load average {os.getloadavg()[0]:.1f} at start", flush=True)
        _deploy("train", "--config", str(CONFIG), "--set", f"model.path={model}", "--set", f"run.output_dir={run}",
                "--set", f"run.total_steps={steps}", "--set", "run.progress=false", "--set", f"rollout.max_staleness={k}",
                "--set", "run.checkpoint_every=0",  # the demo's mid-run checkpoints would stop the prefetch
                "--set", "ray.rollout_cpus=1", "--set", "ray.learner_cpus=1", "--set", f"eval.num_tasks={eval_tasks}",
                "--set", "eval.at_end=true")
        modes[f"max_staleness_{k}"] = {**summarize(run, steps), "run_dir": str(run), "wall_s": time.perf_counter() - t0,
                                       "load_avg_1min_at_end": os.getloadavg()[0]}  # others' load skews the rates
    sync, asyn = modes["max_staleness_0"], modes["max_staleness_1"]
    speedup = asyn["steps_per_hour"] / sync["steps_per_hour"]
    delta = asyn["final_avg_at_k"] - sync["final_avg_at_k"]
    result = {
        "config": str(CONFIG.relative_to(ROOT)), "quick": args.quick, "steps_per_mode": steps,
        "sft_model": str(model), "resources": "ray.rollout_cpus=1, ray.learner_cpus=1 (Ray CPU accounting, no pinning)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "modes": modes, "speedup_steps_per_hour": speedup, "eval_delta": delta,
        "minutes": (time.perf_counter() - start) / 60,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, m in modes.items():
        print(f"{name}: {m['steps_per_hour']:.1f} steps/h (step {m['step_s_mean']:.1f}s: rollout wait "
              f"{m['learner_wait_s_mean']:.1f}s, learn {m['learn_s_mean']:.1f}s, sync wait {m['sync_wait_s_mean']:.1f}s), "
              f"learner idle {m['learner_idle_fraction']:.2f}, staleness max {m['staleness_max']}, "
              f"final Avg@{m['eval_k']} {m['final_avg_at_k']:.3f}", flush=True)
    print(f"wrote {args.out} ({result['minutes']:.1f} min)", flush=True)
    print(f"async vs sync: {speedup:.2f}x steps/hour, staleness max {asyn['staleness_max']}, "
          f"eval delta {delta:+.3f}", flush=True)


if __name__ == "__main__":
    main()
