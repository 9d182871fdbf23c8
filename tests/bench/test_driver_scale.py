"""bench/driver_scale.py at a toy size: synthetic trajectories through the real driver path of one
step (Trainer.train_step on a Cluster of real Ray actors, learners that only receive) in a fresh
driver process; its JSON and its last line."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_toy_sizes_report_cpu_wall_and_memory(tmp_path):
    out = tmp_path / "driver_scale.json"
    res = subprocess.run([sys.executable, "bench/driver_scale.py", "--episodes", "8,16", "--turns", "3",
                          "--prompt-tokens", "40", "--response-tokens", "8", "--teacher-fraction", "0.5",
                          "--workers", "2", "--learners", "2", "--object-store-gb", "1", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"driver per step: 8 ep \d+\.\d\d s \d+\.\d GB; 16 ep \d+\.\d\d s \d+\.\d GB", last), last
    report = json.loads(out.read_text())
    assert [r["episodes"] for r in report["results"]] == [8, 16]
    for row in report["results"]:
        assert row["tokens"] == row["episodes"] * 3 * 48
        assert row["driver_wall_s"] > 0 and row["driver_cpu_s"] > 0 and 0.05 < row["driver_peak_rss_gb"] < 4
        assert "time/rollout_s" in row["stages"] and "time/learn_s" in row["stages"]
        # half the turns routed; the learner ranks rendered every teacher message (>= 40 prompt tokens' text each)
        assert 0 < row["teacher_rows"] < row["turns"] and row["teacher_prompt_tokens"] >= 40 * row["teacher_rows"]
        assert row["learner_shard_s"] > 0
    # rank 0 built the rows of half the episodes; at 16 episodes (two collect calls, one a worker) it
    # fetched one of the two packs, at 8 (one call) the only one
    one, two = report["results"]
    assert one["rank0"] == {"own_rows": 12, "packs_fetched": 1, "packs": 1, "token_fraction_fetched": 1.0}
    assert two["rank0"] == {"own_rows": 24, "packs_fetched": 1, "packs": 2, "token_fraction_fetched": 0.5}
