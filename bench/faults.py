"""Fault injection, measured: one 2-step laptop run per component with `faults.kill=<component>`
(rollout workers, a learner rank of 2, an EnvPool actor and the driver on smoke_cpu.yaml; the
skill bank's Redis server and actor on smoke_cpu_uniskill.yaml), each with its last console line and
the `faults/*` metrics of its metrics.jsonl. The driver run is resumed with `--resume` after its
kill. Writes bench/results/faults.json; docs/results.md section 7 quotes it.

    .venv/bin/python -m deploy build-tiny-model --out runs/tiny/base
    .venv/bin/python bench/faults.py --model runs/tiny/base          # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).parent / "results" / "faults.json"
RUNS = {  # component -> (config, step of the kill, extra overrides); step 2 kills after a sync
    "rollout_worker": ("smoke_cpu.yaml", 2, []),
    "learner": ("smoke_cpu.yaml", 2, ["ray.num_learners=2"]),
    "env_pool": ("smoke_cpu.yaml", 1, []),
    "driver": ("smoke_cpu.yaml", 1, []),
    "skillbank_redis": ("smoke_cpu_uniskill.yaml", 1, []),
    "skillbank_actor": ("smoke_cpu_uniskill.yaml", 1, []),
}


def _train(config: str, model: str, run: Path, sets: list[str], *, resume: bool = False) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "deploy", "train", "--config", str(ROOT / "deploy" / "configs" / config),
           "--set", f"model.path={model}", "--set", f"run.output_dir={run}", "--set", "run.total_steps=2",
           "--set", "eval.at_end=false", *[a for s in sets for a in ("--set", s)], *(["--resume"] if resume else [])]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    return res.returncode, lines[-1] if lines else "", time.perf_counter() - start


def measure(component: str, model: str, tmp: Path) -> dict:
    config, at_step, extra = RUNS[component]
    run = tmp / component
    sets = ["faults.enabled=true", f"faults.kill={component}", f"faults.at_step={at_step}", *extra]
    rc, last, wall = _train(config, model, run, sets)
    if component == "driver":  # the driver killed itself; the resumed run finishes and reports
        rc, last, resumed_wall = _train(config, model, run, sets, resume=True)
        wall += resumed_wall
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run / "metrics.jsonl").exists() else []
    faults = {m["step"]: {k: v for k, v in m.items() if k.startswith("faults/")} for m in metrics}
    return {"component": component, "config": config, "at_step": at_step, "returncode": rc, "last_line": last,
            "survived": rc == 0 and last.startswith(f"faults survived: {component}"),
            "steps_logged": [m["step"] for m in metrics], "policy_versions": [m.get("policy_version") for m in metrics],
            "faults_metrics_by_step": faults, "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="tiny model directory (build-tiny-model)")
    ap.add_argument("--components", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for component in args.components:
            row = measure(component, str(Path(args.model).resolve()), Path(tmp))
            rows.append(row)
            print(f"{component:<16} survived={row['survived']} wall={row['wall_s']:>6.1f}s  {row['last_line']}",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                                    "runs": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
