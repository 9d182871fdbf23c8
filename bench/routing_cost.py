"""Routing cost and teacher tokens, measured on a training run's archived trajectories.

1. Signature + match per turn (the pure routing work) against the rollout time of the same turns
   (metrics.jsonl's time/rollout_s), side by side. Goal: under 1% of rollout time.
2. Teacher tokens scored per step by SMRC-SD vs FullPath-SD on the SAME trajectories (they should
   differ by about the match rate).

    python bench/routing_cost.py --run runs/compare/smrc_sd [--out bench/results/routing_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from deploy.config_loading import load_config
from deploy.stages.smrc_sd import TeacherRouter, with_references
from rollout_workers.types import Trajectory
from routing.matching import route
from routing.reference import SuccessBuffer


def _steps(run: Path) -> list[list[Trajectory]]:
    files = sorted((run / "trajectories").glob("step_*.jsonl"))
    return [[Trajectory.model_validate_json(line) for line in f.read_text().splitlines()] for f in files]


def _route_seconds(trajs: list[Trajectory], buffer: SuccessBuffer) -> tuple[float, int]:
    start, turns = time.perf_counter(), 0
    for ep, ref in with_references(trajs, buffer):
        turns += len(ep.traj.turns)
        if ref is not None:
            route("structured", ep.trace(), ref.trace())
    return time.perf_counter() - start, turns


def _teacher_tokens(router: TeacherRouter, trajs: list[Trajectory], step: int) -> int:
    result = router(trajs, step=step)
    by_id = {t.traj_id: t for t in trajs}
    return sum(len(ids) + len(by_id[tid].turns[i].response_ids) for (tid, i), ids in result.teacher_prompts.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("bench/results/routing_cost.json"))
    args = ap.parse_args()
    from transformers import AutoTokenizer

    cfg = load_config(args.run / "config.resolved.json")
    steps = _steps(args.run)
    records = [json.loads(line) for line in (args.run / "metrics.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    routers = {m: TeacherRouter(method=m, matcher="structured", parts=None, audit_matchers=(), rollout=cfg.rollout,
                                tokenizer=tok, max_chars=cfg.method.teacher_max_chars, seed=0)
               for m in ("smrc_sd", "fullpath_sd")}
    buffer, rows = SuccessBuffer(), []
    for i, (trajs, rec) in enumerate(zip(steps, records), start=1):
        route_s, turns = _route_seconds(trajs, buffer)
        rows.append({"step": i, "turns": turns, "route_us_per_turn": 1e6 * route_s / max(turns, 1),
                     "rollout_ms_per_turn": 1e3 * rec["time/rollout_s"] / max(turns, 1),
                     "route_share_of_rollout": route_s / rec["time/rollout_s"],
                     **{f"teacher_tokens_{m}": _teacher_tokens(r, trajs, i) for m, r in routers.items()}})
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "step"}
    print(f"{'step':>4} {'turns':>6} {'route us/turn':>14} {'rollout ms/turn':>16} {'share':>8} {'teacher tok SMRC':>17} {'FullPath':>9}")
    for r in rows:
        print(f"{r['step']:>4} {r['turns']:>6} {r['route_us_per_turn']:>14.0f} {r['rollout_ms_per_turn']:>16.1f} "
              f"{100 * r['route_share_of_rollout']:>7.2f}% {r['teacher_tokens_smrc_sd']:>17} {r['teacher_tokens_fullpath_sd']:>9}")
    print(f"median: routing = {100 * summary['route_share_of_rollout']:.2f}% of rollout time; "
          f"teacher tokens SMRC/FullPath = {summary['teacher_tokens_smrc_sd'] / max(summary['teacher_tokens_fullpath_sd'], 1):.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"run": str(args.run), "steps": rows, "median": summary}, indent=2))


if __name__ == "__main__":
    main()
