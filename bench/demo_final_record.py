"""The demo's final record, re-checkable from the repository: the sha256 of the final RL weights
and the per-task final evaluation of one `make demo` output directory, merged into
results/demo/repro.json under "final_rl" (the other keys are kept).

    .venv/bin/python bench/demo_final_record.py --write-repro runs/demo
    .venv/bin/python bench/demo_final_record.py --write-repro runs/demo_repro/run0 --out /tmp/repro.json

RUN_DIR is the demo's --out directory: the GRPO run is RUN_DIR/rl, its final weights the Hugging
Face export of its last checkpoint (rl/checkpoints/step_N/hf) and its final evaluation
rl/eval/step_NNNN.json of that step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deploy.evaluation import EvalResult
from deploy.experiment.runner import model_digest
from deploy.trainer import TrainerState, latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "results" / "demo" / "repro.json"


class RecordError(ValueError):
    """A run directory that does not hold a finished demo (a user mistake, not a bug)."""


def final_record(run_dir: Path) -> dict:
    """{"step", "rl_sha256", "eval": {split, k, num_tasks, avg_at_k, avg_at_k_se, pass_at_k,
    per_task_type, per_task}} of the demo in `run_dir`; RecordError when it is not finished."""
    rl = run_dir / "rl"
    ckpt = latest_checkpoint(rl)
    if ckpt is None:
        raise RecordError(
            f"{rl}: no finished GRPO checkpoint; pass the --out directory of a finished `make demo`"
        )
    step = TrainerState.load(ckpt / "trainer_state.json").step
    eval_path = rl / "eval" / f"step_{step:04d}.json"
    if not eval_path.exists():
        raise RecordError(
            f"{eval_path} is missing: the demo's final evaluation did not finish; rerun `make demo`"
        )
    result = EvalResult.model_validate_json(eval_path.read_text())
    return {
        "run_dir": str(run_dir),
        "step": step,
        "rl_sha256": model_digest(ckpt / "hf"),
        "eval": {
            "split": result.split,
            "k": result.k,
            "num_tasks": result.num_tasks,
            "avg_at_k": result.avg_at_k,
            "avg_at_k_se": result.avg_at_k_se,
            "pass_at_k": result.pass_at_k,
            "per_task_type": {name: t.avg_at_k for name, t in sorted(result.per_task_type.items())},
            "per_task": dict(sorted(result.per_task.items())),
        },
    }


def write_repro(run_dir: Path, out: Path) -> dict:
    """Merge `final_record(run_dir)` into `out` under "final_rl" (created when absent)."""
    record = json.loads(out.read_text()) if out.exists() else {}
    record["final_rl"] = final_record(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(out)
    return record["final_rl"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--write-repro", type=Path, required=True, metavar="RUN_DIR", help="a finished demo's --out dir"
    )
    ap.add_argument("--out", type=Path, default=REPRO, help=f"the record to update (default {REPRO})")
    args = ap.parse_args(argv)
    if not args.write_repro.is_dir():
        print(
            f"error: {args.write_repro} is not a directory; pass the --out directory of `make demo`",
            file=sys.stderr,
        )
        return 2
    try:
        final = write_repro(args.write_repro, args.out)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{args.out}: final_rl step {final['step']}, sha256 {final['rl_sha256'][:16]}..., "
        f"Avg@{final['eval']['k']} {final['eval']['avg_at_k']:.3f} over {final['eval']['num_tasks']} tasks"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
