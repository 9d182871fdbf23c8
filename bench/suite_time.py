"""Seconds of a pytest run per test area, from its JUnit XML (pytest --junitxml=FILE).

    make test      # tests/run_suite.sh writes runs/junit-rest.xml and runs/junit-e2e.xml
    python bench/suite_time.py runs/junit-rest.xml runs/junit-e2e.xml [--json out.json]

An area is the test file's folder under tests/ (tests/deploy, tests/learner, ...; files directly
in tests/ are "tests"). The seconds are each test's own, summed over the reports: with two pytest
processes side by side the wall time is less than the total.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def area(classname: str) -> str:
    """'tests.deploy.test_faults' -> 'tests/deploy'; 'tests.test_layout' -> 'tests'."""
    parts = classname.split(".")
    folders = [p for p in parts[:-1] if not p.startswith("test_") and not p[:1].isupper()]
    return "/".join(folders) if folders else "tests"


def summarise(*reports: Path) -> dict[str, dict[str, float]]:
    """area -> {"tests": n, "seconds": s, "failed": n, "skipped": n}, over every report."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, "seconds": 0.0, "failed": 0, "skipped": 0})
    cases = [case for junit in reports for case in ET.parse(junit).getroot().iter("testcase")]
    for case in cases:
        row = out[area(case.get("classname", ""))]
        row["tests"] += 1
        row["seconds"] += float(case.get("time", 0.0))
        row["failed"] += any(child.tag in ("failure", "error") for child in case)
        row["skipped"] += any(child.tag == "skipped" for child in case)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path, nargs="+", help="JUnit XML reports (pytest --junitxml)")
    ap.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    args = ap.parse_args(argv)
    missing = [p for p in args.junit if not p.is_file()]
    if missing:
        print(f"error: {missing[0]} does not exist: run pytest with --junitxml={missing[0]} first", file=sys.stderr)
        return 2
    table = summarise(*args.junit)
    total = sum(r["seconds"] for r in table.values())
    for name, r in table.items():
        print(f"{name:<28} {int(r['tests']):>5} tests {r['seconds'] / 60:>7.1f} min  {int(r['failed'])} failed")
    print(f"{'all':<28} {sum(int(r['tests']) for r in table.values()):>5} tests {total / 60:>7.1f} min (test time, summed)")
    if args.json is not None:
        args.json.write_text(json.dumps({"areas": table, "total_s": total}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
