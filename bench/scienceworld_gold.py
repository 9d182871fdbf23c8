"""ScienceWorld parity: its own gold action sequences replayed through the project's wrapper
(plugins/scienceworld_env), tasks round-robin over the task types; the record behind
docs/results.md "ScienceWorld gold replay".

    .venv/bin/python bench/scienceworld_gold.py                  # 30 tasks -> bench/results/scienceworld_gold.json
    .venv/bin/python bench/scienceworld_gold.py --tasks 60 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from importlib import metadata
from pathlib import Path

from scienceworld_env.gold import gold_replay

DEFAULT_OUT = Path(__file__).parent / "results" / "scienceworld_gold.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--split", default="train", choices=["train", "valid_seen", "valid_unseen"])
    parser.add_argument("--simplifications", default="easy")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    t0 = time.perf_counter()
    result = gold_replay(num_tasks=args.tasks, split=args.split, simplifications=args.simplifications)
    record = {"won": result.won, "total": result.total, "task_types": result.task_types,
              "failures": result.failures, "split": args.split, "simplifications": args.simplifications,
              "seconds": round(time.perf_counter() - t0, 1), "scienceworld": metadata.version("scienceworld"),
              "machine": f"{platform.machine()}, {platform.python_version()} (shared, loaded laptop-class CPU)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for line in result.failures:
        print(line)
    print(f"scienceworld gold replay: {result.won}/{result.total} won ({result.task_types} task types, "
          f"{record['seconds']} s) -> {args.out}")


if __name__ == "__main__":
    main()
