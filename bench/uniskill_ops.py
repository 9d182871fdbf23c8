"""UniSkill proposal operations of finished runs, side by side (docs/results.md, "UniSkill proposal
operations before and after the reward rules").

Reads each run's archived proposals (RUN/uniskill/proposals_step_N.jsonl) and writes, per run: the op
shares of the proposals (NO_SKILL / ADD / UPDATE / parse failure) per step, over all steps, after the
warm-up and from step `--from-step` on (a step whose groups held no candidate has no proposals); the mean reward per op after the warm-up; how many NO_SKILL
proposals the critic judged unreasonable, how many edits it passed and how many had text the bank
would refuse; and the bank's decisions (accepted = applied).

    python bench/uniskill_ops.py runs/uniskill_ops/before runs/uniskill_ops/after \\
        --out results/uniskill_ops/ops.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

OPS = ("no_edit", "add", "update")


def load_records(run: Path) -> list[dict]:
    files = sorted((run / "uniskill").glob("proposals_step_*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def op_shares(records: Sequence[dict]) -> dict[str, float | int]:
    """Proposal count and the share of each op among all proposals (parse failures: "unparsed")."""
    n = len(records)
    counts = Counter(r["op"] or "unparsed" for r in records)
    return {"proposals": n, **{op: (counts[op] / n if n else 0.0) for op in (*OPS, "unparsed")}}


def mean_reward_per_op(records: Sequence[dict]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for op in (*OPS, None):
        rewards = [r["reward"] for r in records if r["op"] == op and r["reward"] is not None]
        out[op or "unparsed"] = sum(rewards) / len(rewards) if rewards else None
    return out


def summarise(run: Path, *, from_step: int) -> dict:
    records = load_records(run)
    if not records:
        raise SystemExit(f"error: {run} has no uniskill/proposals_step_*.jsonl; pass a finished UniSkill run")
    steps = sorted({r["step"] for r in records})
    after_warmup = [r for r in records if not r["warmup"]]
    tail = [r for r in records if r["step"] >= from_step]
    no_skill = [r for r in after_warmup if r["op"] == "no_edit"]
    return {
        "run": str(run),
        "steps": steps,
        "per_step": {str(s): op_shares([r for r in records if r["step"] == s]) for s in steps},
        "all_steps": op_shares(records),
        "after_warmup": op_shares(after_warmup),
        f"steps_{from_step}_on": op_shares(tail),
        "mean_reward_after_warmup": mean_reward_per_op(after_warmup),
        "no_skill_after_warmup": len(no_skill),
        "no_skill_judged_unreasonable": sum(r["verdict_passed"] is False for r in no_skill),
        "edits_after_warmup_refused_text": sum("invalid skill text" in r["verdict_reason"] for r in after_warmup),
        "edits_after_warmup_critic_passed": sum(r["op"] in OPS[1:] and r["verdict_passed"] is True
                                                for r in after_warmup),
        "decisions": dict(Counter(r["decision"] or "none" for r in records)),
        "applied": sum(r["decision"] == "accepted" for r in records),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished UniSkill run directories")
    ap.add_argument("--from-step", type=int, default=8, help="first step of the tail summarised on its own (8)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--note", default="", help="what the runs are (code, config), kept in the JSON")
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else list(argv)
    out = {"command": " ".join(["python bench/uniskill_ops.py", *given]), "note": args.note,
           "runs": {run.name: summarise(run, from_step=args.from_step) for run in args.runs}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, s in out["runs"].items():
        t = s[f"steps_{args.from_step}_on"]
        print(f"{name}: steps {args.from_step}+ NO_SKILL {t['no_edit']:.2f} ADD {t['add']:.2f} "
              f"UPDATE {t['update']:.2f} unparsed {t['unparsed']:.2f} of {t['proposals']}; applied {s['applied']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
