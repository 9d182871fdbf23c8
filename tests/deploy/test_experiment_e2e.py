"""One tiny real grid through the CLI: the initial model's evaluation (a real `deploy eval`), then 1 arm x
2 seeds x 1 GRPO step on the smoke config (each run a real `deploy train` on local Ray with the torch
learner, the HF engine and 4-step episodes: this test is about the grid, not the engine, DeepSpeed or
the episode length), then the report, then a rerun that trains and evaluates nothing. Two seeds, not
two arms, keep it short; paired differences between arms are checked on synthetic runs in
test_experiment_grid.py."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tasks(run_dir: Path) -> list[str]:
    lines = (run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    return sorted({json.loads(line)["task"]["task_id"] for line in lines})


def test_tiny_grid_runs_reports_and_skips_finished_runs(model, tmp_path):
    grid = tmp_path / "tiny.yaml"
    grid.write_text(f"""\
name: tiny
base: {ROOT / "deploy" / "configs" / "smoke_cpu.yaml"}
model:
  path: {model}
overrides:
  run.total_steps: 1
  engine.engine: hf
  env.max_steps: 4
  learner.use_deepspeed: false
  learner.zero_stage: 0
eval:
  num_tasks: 2
  k: 2
arms:
  grpo:
seeds: [0, 1]
min_seeds: 1
""")
    runs, results = tmp_path / "runs", tmp_path / "results"
    cmd = [sys.executable, "-m", "deploy", "experiment", "run", "--grid", str(grid), "--out", str(runs),
           "--results", str(results)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    r0, r1 = (json.loads((results / f"grpo_seed{s}.json").read_text()) for s in (0, 1))
    assert (r0["seed"], r1["seed"]) == (0, 1) and r0["total_steps"] == 1
    assert [p["step"] for p in r0["success_curve"]] == [1]
    assert r0["config"]["run"]["seed"] == 0 and r1["config"]["rollout"]["seed"] == 1
    # the same fixed evaluation tasks for every run, a different training task stream per seed
    assert set(r0["final_eval"]["per_task"]) == set(r1["final_eval"]["per_task"])
    assert len(r0["final_eval"]["per_task"]) == 2 and r0["final_eval"]["k"] == 2
    assert _tasks(runs / "grpo_seed0") != _tasks(runs / "grpo_seed1")
    summary = json.loads((results / "summary.json").read_text())
    assert summary["arms"][0]["seeds"] == [0, 1] and summary["missing"] == []
    mean = (r0["final_eval"]["avg_at_k"] + r1["final_eval"]["avg_at_k"]) / 2
    assert abs(summary["arms"][0]["avg_at_k"] - mean) < 1e-12
    assert "| grpo | 0,1 |" in res.stdout and (results / "curves.png").stat().st_size > 1000
    # the initial model, evaluated once on the runs' evaluation tasks, and every arm compared with it
    initial = json.loads((results / "initial.json").read_text())
    assert set(initial["eval"]["per_task"]) == set(r0["final_eval"]["per_task"]) and initial["eval"]["k"] == 2
    assert initial["model_sha256"] == r0["model_sha256"] and initial["eval"]["policy_version"] == 0
    assert summary["paired_vs_initial"]["grpo"]["seeds"] == [0, 1] and "| grpo - initial |" in res.stdout

    # a finished run dir whose JSON was lost is collected, not retrained; a run with its JSON is skipped
    (results / "grpo_seed1.json").unlink()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "grpo_seed1: collect" in again.stderr and "1 already done" in again.stderr
    assert "[initial]" not in again.stderr
    assert json.loads((results / "grpo_seed1.json").read_text())["final_eval"] == r1["final_eval"]
    assert not (runs / "grpo_seed1.crashed-1").exists()
