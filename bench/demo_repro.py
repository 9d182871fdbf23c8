"""`make demo` as a distribution: run the demo N times from scratch, each into its own directory,
and compare the runs stage by stage to say which stages are bit-for-bit reproducible.

Per stage it compares:
- the tiny model and the SFT model: sha256 over the weight files;
- the random-init and SFT evaluations: the per-task success (exact equality);
- GRPO: per training step, the sampled token ids of every turn (by trajectory id) and the sampler's
  log-probs of those ids, to find the first step where the runs part and how (same ids with
  different log-probs = floating-point drift; different ids = a different sample);
- the final evaluation: Avg@k and the paired RL gain over SFT.

Writes results/demo/repro.json (runs, medians, first divergence) and results/demo/repro.png (the
after-SFT and after-RL Avg@k of every run, and each run's training success per step).

    .venv/bin/python bench/demo_repro.py --runs 3        # about 19-20 min per run on 2 cores (measured 2026-12-03)
    .venv/bin/python bench/demo_repro.py --compare-only  # re-read runs/demo_repro/run*/
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from deploy.experiment.runner import model_digest

ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = ROOT / "runs" / "demo_repro"
OUT = ROOT / "results" / "demo"


def _eval(run: Path, label: str) -> dict | None:
    path = run / "eval" / f"{label}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _episode_key(traj_id: str, groups: dict[str, str]) -> str:
    """A trajectory's name that two runs share. Its id is `task@seed#<random>/k`; keep task@seed
    and k, and number a task's groups in the order they first appear in the step's file."""
    group, k = traj_id.rsplit("/", 1)
    if group not in groups:
        task = group.split("#", 1)[0]
        groups[group] = f"{task}#{sum(1 for name in groups.values() if name.startswith(task + '#'))}"
    return f"{groups[group]}/{k}"


def _steps(run: Path) -> dict[int, dict[str, list[tuple[list[int], list[float]]]]]:
    """step -> episode key -> [(response ids, sampler log-probs) per turn]."""
    steps = {}
    for path in sorted((run / "rl" / "trajectories").glob("step_*.jsonl")):
        trajs, groups = {}, {}
        for line in path.read_text().splitlines():
            if line.strip():
                t = json.loads(line)
                turns = [(turn["response_ids"], turn.get("sampler_logprobs") or []) for turn in t["turns"]]
                trajs[_episode_key(t["traj_id"], groups)] = turns
        steps[int(path.stem.split("_")[1])] = trajs
    return steps


def _compare_steps(a: dict, b: dict) -> dict:
    """First step where two runs' rollouts differ, and how."""
    for step in sorted(set(a) & set(b)):
        ta, tb = a[step], b[step]
        if ta.keys() != tb.keys():
            return {"first_step": step, "kind": "different tasks or episodes"}
        ids_differ = [k for k in ta if [ids for ids, _ in ta[k]] != [ids for ids, _ in tb[k]]]
        drift = max((abs(x - y) for k in ta for (_, la), (_, lb) in zip(ta[k], tb[k]) for x, y in zip(la, lb)),
                    default=0.0)
        if ids_differ or drift > 0.0:
            return {"first_step": step, "kind": "different sampled ids" if ids_differ else "same ids, log-probs differ",
                    "trajectories_with_other_ids": len(ids_differ), "trajectories": len(ta),
                    "max_abs_logprob_diff": drift}
    return {"first_step": None, "kind": "identical over the common steps", "steps_compared": len(set(a) & set(b))}


def summarize(run: Path) -> dict:
    summary = json.loads((run / "demo_summary.json").read_text())
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    sft, rl = summary["after SFT"], summary["after RL"]
    return {
        "run": run.name, "minutes": round(summary["minutes"], 2), "stage_seconds": summary.get("stage_seconds"),
        "base_sha256": model_digest(run / "base"), "sft_sha256": model_digest(run / "sft"),
        "random_init_avg": summary["random init"]["avg_at_k"], "sft_avg": sft["avg_at_k"], "rl_avg": rl["avg_at_k"],
        "rl_gain": summary["rl_gain_paired"]["mean"], "rl_gain_se": summary["rl_gain_paired"]["se"],
        "train_success_by_step": [m.get("success_rate") for m in metrics],
    }


def compare(runs: list[Path]) -> dict:
    rows = [summarize(r) for r in runs]
    ref, ref_steps = runs[0], _steps(runs[0])
    stages = {
        "tiny model weights": all(r["base_sha256"] == rows[0]["base_sha256"] for r in rows),
        "random-init evaluation (per task)": all(
            _eval(r, "random_init")["per_task"] == _eval(ref, "random_init")["per_task"] for r in runs),
        "SFT weights": all(r["sft_sha256"] == rows[0]["sft_sha256"] for r in rows),
        "SFT evaluation (per task)": all(
            _eval(r, "after_sft")["per_task"] == _eval(ref, "after_sft")["per_task"] for r in runs),
        "final evaluation (per task)": all(
            json.loads(max((r / "rl" / "eval").glob("step_*.json")).read_text())["per_task"]
            == json.loads(max((ref / "rl" / "eval").glob("step_*.json")).read_text())["per_task"] for r in runs),
    }
    divergence = {r.name: _compare_steps(ref_steps, _steps(r)) for r in runs[1:]}

    def stats(key: str) -> dict:
        xs = [r[key] for r in rows]
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs),
                "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0}

    return {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu_model": _cpu_model()},
            "runs": rows, "bit_identical_across_runs": stages, "rl_rollouts_vs_first_run": divergence,
            "distribution": {k: stats(k) for k in ("sft_avg", "rl_avg", "rl_gain", "minutes")}}


def _cpu_model() -> str:
    """The CPU's model name: the demo's time (and float32 kernels) depend on it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, r in enumerate(result["runs"]):
        left.plot([0, 1], [r["sft_avg"], r["rl_avg"]], marker="o", label=r["run"])
        right.plot(range(1, len(r["train_success_by_step"]) + 1), r["train_success_by_step"], label=r["run"])
    left.set_xticks([0, 1], ["after SFT", "after RL"])
    left.set_ylabel("Avg@4 success (valid_unseen, 48 tasks)")
    left.set_title("make demo, run to run", fontsize=10)
    right.set_xlabel("GRPO step")
    right.set_ylabel("training success rate")
    right.set_title("training success per step", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3,
                    help="number of demo runs to have (finished ones are kept, an interrupted one continues)")
    ap.add_argument("--compare-only", action="store_true", help="only compare the runs already under runs/demo_repro/")
    args = ap.parse_args()
    if not args.compare_only:
        for i in range(args.runs):
            run = RUNS_DIR / f"run{i}"
            if (run / "demo_summary.json").exists():
                continue
            print(f"demo run {i + 1}/{args.runs} -> {run}", flush=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "deploy", "demo", "--out", str(run)], cwd=ROOT, check=True,
                           env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
            print(f"  done in {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    runs = sorted(p for p in RUNS_DIR.glob("run*") if (p / "demo_summary.json").exists())
    if len(runs) < 2:
        sys.exit(f"need at least 2 finished runs under {RUNS_DIR} to compare, found {len(runs)}")
    result = compare(runs)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "repro.json").write_text(json.dumps(result, indent=2))
    plot(result, OUT / "repro.png")
    print(json.dumps({k: result[k] for k in ("bit_identical_across_runs", "rl_rollouts_vs_first_run", "distribution")},
                     indent=2))


if __name__ == "__main__":
    main()
