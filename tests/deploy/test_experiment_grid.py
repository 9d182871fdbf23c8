"""Grid files and the experiment runner's pure parts (deploy/experiment/): schema errors that name the
key, the shipped grids, run planning, skip/resume decisions and the statistics of the report on
synthetic runs with hand-checked numbers. The real grid runs in test_experiment_e2e.py."""

import json
import math
import os
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.evaluation import EvalResult
from deploy.experiment.grid import GridError, expand_vars, load_grid, plan_runs, run_overrides, run_state
from deploy.experiment.report import (
    CurvePoint,
    InitialResult,
    RunResult,
    check_one_model,
    curve_band,
    mean_se,
    paired_vs_reference,
    summarize_arm,
    write_report,
)
from deploy.experiment.runner import (
    collect_result,
    ensure_model,
    model_digest,
    move_aside,
    run_analyses,
    run_args,
    run_grid,
    train_command,
)

ROOT = Path(__file__).resolve().parents[2]
GRIDS = ROOT / "deploy" / "experiments"

VALID = """\
name: g1
base: {base}
model:
  path: /models/x
overrides:
  run.total_steps: 2
eval:
  num_tasks: 4
  k: 2
arms:
  grpo:
  smrc:
    method.name: smrc_sd
    learner.sd.coef: 0.1
seeds: [0, 1, 2]
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "grid.yaml"
    p.write_text(text.replace("{base}", str(ROOT / "deploy" / "configs" / "smoke_cpu.yaml")))
    return p


@pytest.mark.parametrize(("change", "names"), [
    (("seeds: [0, 1, 2]", "seeds: [0, 1]"), ["seeds", "min_seeds=3"]),
    (("seeds: [0, 1, 2]", "seeds: [0, 0, 1]"), ["seeds", "distinct"]),
    (("  run.total_steps: 2", "  run.total_steps: 2\n  run.seed: 4"), ["overrides.run.seed"]),
    (("    learner.sd.coef: 0.1", "    learner.sd.coef: 0.1\n    run.total_steps: 9"), ["arms.smrc.run.total_steps"]),
    (("    learner.sd.coef: 0.1", "    learner.sd.coef: 0.1\n    env.preset: hard"), ["arms.smrc.env.preset"]),
    (("    learner.sd.coef: 0.1", "    learner.sd.coef: 0.1\n    eval.k: 8"), ["arms.smrc.eval.k"]),
    (("    learner.sd.coef: 0.1", "    learner:\n      sd: 1"), ["arms.smrc.learner", "dotted keys"]),
    (("seeds:", "reference: nope\nseeds:"), ["reference", "nope"]),
    (("seeds:", "comparisons: [[smrc, grpoo]]\nseeds:"), ["comparisons", "grpoo"]),
    (("eval:", "evals:"), ["evals", "unknown key"]),
    (("  path: /models/x", "  path: /models/x\n  build:\n    out: runs/tb"), ["model", "exactly one"]),
    (("name: g1", "name: G 1"), ["name"]),
    (("  grpo:", "  Bad Arm:"), ["arms.Bad Arm"]),
    (("seeds:", "analyses:\n  smrcc: [replay-audit]\nseeds:"), ["analyses.smrcc", "not an arm"]),
    (("seeds:", "analyses:\n  smrc: [replay-audits]\nseeds:"), ["analyses.smrc", "replay-audit"]),
    (("seeds:", "analyses:\n  smrc: [replay-audit --run x]\nseeds:"), ["analyses.smrc", "drop --run"]),
])
def test_grid_errors_name_the_key(tmp_path, change, names):
    text = VALID.replace(*change)
    assert text != VALID
    with pytest.raises(GridError) as err:
        load_grid(_write(tmp_path, text))
    for name in names:
        assert name in str(err.value), str(err.value)


def test_grid_file_and_base_must_exist(tmp_path):
    with pytest.raises(GridError, match="does not exist"):
        load_grid(tmp_path / "missing.yaml")
    p = tmp_path / "grid.yaml"
    p.write_text(VALID.replace("{base}", "nowhere.yaml"))
    grid = load_grid(p)
    run = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")[0]
    with pytest.raises(GridError, match="base='nowhere.yaml'"):
        run_args(grid, p, run, "/models/x")


def test_an_arm_that_does_not_validate_fails_before_any_run(tmp_path):
    p = _write(tmp_path, VALID.replace("method.name: smrc_sd", "method.name: smrc"))
    grid = load_grid(p)
    with pytest.raises(GridError, match=r"(?s)arm smrc .*method\.name"):
        run_grid(grid, p, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res", python="/nonexistent/python")
    assert not (tmp_path / "runs").exists()


def test_plan_is_seed_major_and_filters(tmp_path):
    grid = load_grid(_write(tmp_path, VALID))
    plan = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")
    assert [r.key for r in plan] == ["grpo_seed0", "smrc_seed0", "grpo_seed1", "smrc_seed1", "grpo_seed2", "smrc_seed2"]
    assert plan[1].run_dir == tmp_path / "runs" / "smrc_seed0"
    assert plan[1].result_path == tmp_path / "res" / "smrc_seed0.json"
    only = plan_runs(grid, runs_dir=tmp_path, results_dir=tmp_path, only=["smrc"], seeds=[2, 0])
    assert [r.key for r in only] == ["smrc_seed0", "smrc_seed2"]
    with pytest.raises(GridError, match="--only nope"):
        plan_runs(grid, runs_dir=tmp_path, results_dir=tmp_path, only=["nope"])
    with pytest.raises(GridError, match="--seeds 7"):
        plan_runs(grid, runs_dir=tmp_path, results_dir=tmp_path, seeds=[7])


def test_a_seed_sets_every_seed_and_arms_share_the_rest(tmp_path):
    p = _write(tmp_path, VALID)
    grid = load_grid(p)
    plan = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")
    cfgs = {r.key: load_config(*run_args(grid, p, r, "/models/x")) for r in plan}
    a, b = cfgs["grpo_seed1"], cfgs["smrc_seed1"]
    assert (a.run.seed, a.rollout.seed, a.learner.seed) == (1, 1, 1)
    assert a.method.name == "grpo" and b.method.name == "smrc_sd"
    for section in ("env", "eval"):
        assert getattr(a, section) == getattr(b, section)
    assert (a.run.total_steps, a.rollout.tasks_per_step, a.eval.num_tasks, a.eval.k) == (2, 2, 4, 2)
    assert a.run.output_dir == str(tmp_path / "runs" / "grpo_seed1") and a.model.path == "/models/x"
    assert cfgs["grpo_seed0"].run.seed == 0
    assert "run.seed=1" in run_overrides(grid, plan[2], "/m")


def test_model_path_expands_variables(tmp_path, monkeypatch):
    p = _write(tmp_path, VALID.replace("/models/x", "${H7_TEST_MODEL}"))
    grid = load_grid(p)
    monkeypatch.delenv("H7_TEST_MODEL", raising=False)
    with pytest.raises(GridError, match="H7_TEST_MODEL is not set"):
        run_grid(grid, p, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res", python="/nonexistent/python")
    monkeypatch.setenv("H7_TEST_MODEL", str(tmp_path / "empty"))
    with pytest.raises(GridError, match="holds no config.json"):
        run_grid(grid, p, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res", python="/nonexistent/python")


def test_a_variable_default_applies_only_when_unset():
    assert expand_vars("${H7_A:-runs/m}/x", "k", env={}) == "runs/m/x"
    assert expand_vars("${H7_A:-runs/m}", "k", env={"H7_A": "/abs"}) == "/abs"
    assert expand_vars("${H7_A:-runs/m}", "k", env={"H7_A": ""}) == "runs/m"
    with pytest.raises(GridError, match="H7_A is not set"):
        expand_vars("${H7_A:-}", "k", env={})


def test_model_digest_covers_the_weights_and_the_report_refuses_mixed_models(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(GridError, match="no \\*.safetensors"):
        model_digest(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w1")
    (tmp_path / "m" / "config.json").write_text("{}")
    first = model_digest(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text('{"x": 1}')  # not a weight file
    assert model_digest(tmp_path / "m") == first
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w2")
    assert model_digest(tmp_path / "m") != first
    runs = [r.model_copy(update={"model_sha256": "a" * 64}) for r in REF + ARM]
    check_one_model(runs)
    mixed = runs[:-1] + [runs[-1].model_copy(update={"model_sha256": "b" * 64})]
    with pytest.raises(ValueError, match="2 different initial models .*smrc_seed2"):
        write_report("g", ["grpo", "smrc"], "grpo", mixed, tmp_path / "out", expected=[], k=2)


def test_a_built_model_is_reused_only_when_the_build_finished(tmp_path):
    p = _write(tmp_path, VALID.replace("  path: /models/x", f"  build:\n    out: {tmp_path / 'tb'}"))
    grid = load_grid(p)
    (tmp_path / "tb" / "model").mkdir(parents=True)
    (tmp_path / "tb" / "model" / "config.json").write_text("{}")
    with pytest.raises(GridError, match="cannot start"):  # build.json missing: the build must run again
        ensure_model(grid, python="/nonexistent/python", log=print)
    (tmp_path / "tb" / "build.json").write_text("{}")
    assert ensure_model(grid, python="/nonexistent/python", log=print) == str(tmp_path / "tb" / "model")


@pytest.mark.parametrize("name", ["quick", "smrc_sd", "uniskill"])
def test_shipped_grids_validate_every_arm(name, monkeypatch):
    monkeypatch.setenv("TESTBED_MODEL", "/models/testbed")
    path = GRIDS / f"{name}.yaml"
    grid = load_grid(path)
    assert len(grid.seeds) >= 3
    expected = {"quick": {"grpo", "smrc_sd"},
                "smrc_sd": {"grpo", "fullpath_sd", "smrc_sd", "routing_only", "random_turn"},
                "uniskill": {"grpo", "uniskill", "actor_only", "no_r_align", "no_support_reg"}}[name]
    assert set(grid.arms) == expected and grid.reference_arm == "grpo"
    if name != "quick":  # the pre-registered pairs of docs/testbed.md besides "vs grpo"
        pairs = {"smrc_sd": [("smrc_sd", "fullpath_sd"), ("routing_only", "random_turn")],
                 "uniskill": [("uniskill", "actor_only")]}[name]
        assert all(p in grid.comparisons for p in pairs)
    plan = plan_runs(grid, runs_dir=Path("/tmp/runs"), results_dir=Path("/tmp/res"))
    cfgs = {r.key: load_config(*run_args(grid, path, r, "/models/testbed")) for r in plan}
    seed0 = [c for k, c in cfgs.items() if k.endswith("_seed0")]
    budget = {(c.run.total_steps, c.rollout.tasks_per_step, c.rollout.group_size, c.env, c.eval) for c in seed0}
    assert len(budget) == 1  # one budget, environment and evaluation for every arm
    methods = {k.rsplit("_seed", 1)[0]: (c.method.name, c.uniskill.enabled and c.uniskill.variant) for k, c in cfgs.items()}
    if name == "uniskill":
        assert methods["grpo"] == ("grpo", False)
        assert all(methods[a] == ("grpo", a) for a in expected - {"grpo"})
    else:
        assert all(methods[a] == (a, False) for a in expected)


def _done_run(d: Path, *, total: int, split: str = "valid_unseen", checkpoint: bool = True) -> None:
    (d / "eval").mkdir(parents=True)
    (d / "eval" / f"step_{total:04d}.json").write_text(_eval({"t1": 1.0}, split=split).model_dump_json())
    if checkpoint:
        (d / "checkpoints" / f"step_{total:06d}").mkdir(parents=True)
        (d / "checkpoints" / f"step_{total:06d}" / "trainer_state.json").write_text("{}")


FAKE_ANALYZE = """#!/bin/sh
# stands in for `python -m deploy analyze SUB ... --run DIR`: writes DIR/analysis/<sub>.json, fails on --fail
run=""; sub="$4"; prev=""
for a in "$@"; do [ "$prev" = "--run" ] && run="$a"; [ "$a" = "--fail" ] && exit 3; prev="$a"; done
mkdir -p "$run/analysis/logs" && echo '{"sub": "'"$sub"'"}' > "$run/analysis/$sub.json" && touch "$run/analysis/logs/x.log"
"""


def test_analyses_run_once_per_run_and_their_outputs_are_kept(tmp_path):
    text = VALID.replace("seeds:", "analyses:\n  smrc: [replay-audit, 'skills-growth --fail']\nseeds:")
    grid = load_grid(_write(tmp_path, text))
    fake = tmp_path / "python"
    fake.write_text(FAKE_ANALYZE)
    fake.chmod(0o755)
    plan = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")
    run = next(r for r in plan if r.arm == "smrc")
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "analysis").mkdir()
    (run.run_dir / "analysis" / "old.json").write_text("{}")  # written before: not this analysis's output
    os.utime(run.run_dir / "analysis" / "old.json", (1, 1))
    kw = {"results_dir": tmp_path / "res", "python": str(fake), "cwd": tmp_path, "log_path": tmp_path / "a.log",
          "log": print}
    run_analyses(grid, run, **kw)
    dest = tmp_path / "res" / "analysis" / run.key
    assert json.loads((dest / "replay-audit.json").read_text()) == {"sub": "replay-audit"}
    assert not (dest / "old.json").exists() and not (dest / "logs").exists()
    done = json.loads((dest / "replay-audit.done").read_text())
    assert done["command"][:2] == ["analyze", "replay-audit"] and done["files"] == ["replay-audit.json"]
    # the second analysis failed twice: recorded, not done, and the run still counts
    failed = json.loads((dest / "skills-growth.failed").read_text())
    assert failed["exit"] == 3 and not (dest / "skills-growth.done").exists()
    assert (tmp_path / "a.log").read_text().count("skills-growth --fail") == 2
    (dest / "replay-audit.json").write_text("kept")  # a retry does not run a finished analysis again
    grid2 = load_grid(_write(tmp_path, VALID.replace("seeds:", "analyses:\n  smrc: [replay-audit]\nseeds:")))
    run_analyses(grid2, run, **kw)
    assert (dest / "replay-audit.json").read_text() == "kept"
    log_before = (tmp_path / "a.log").read_text()
    run_analyses(grid2, plan[0], **kw)  # grpo: no analyses for this arm
    assert plan[0].arm == "grpo" and (tmp_path / "a.log").read_text() == log_before


def test_run_state_skip_collect_resume_restart(tmp_path):
    grid = load_grid(_write(tmp_path, VALID))
    run = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")[0]
    assert run_state(run, 2, "valid_unseen") == "fresh"
    (run.run_dir / "logs").mkdir(parents=True)  # crashed before its first checkpoint
    assert run_state(run, 2, "valid_unseen") == "restart"
    aside = move_aside(run.run_dir)
    assert aside.name == "grpo_seed0.crashed-1" and not run.run_dir.exists()
    ckpt = run.run_dir / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"step": 1, "policy_version": 1}')  # crashed after step 1 of 2
    assert run_state(run, 2, "valid_unseen") == "resume"
    cmd = train_command("py", Path("base.yaml"), ["run.seed=0"], resume=True)
    assert cmd == ["py", "-m", "deploy", "train", "--config", "base.yaml", "--set", "run.seed=0", "--resume"]
    assert "--resume" not in train_command("py", Path("b"), [], resume=False)
    _done_run(run.run_dir, total=2)  # trained and evaluated; the grid stopped before writing the JSON
    assert run_state(run, 2, "valid_unseen") == "collect"
    run.result_path.parent.mkdir(parents=True)
    run.result_path.write_text("{}")
    assert run_state(run, 2, "valid_unseen") == "done"


def test_runs_with_results_json_are_skipped_without_training(tmp_path):
    p = _write(tmp_path, VALID)
    grid = load_grid(p)
    plan = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")
    for r in plan:
        r.result_path.parent.mkdir(parents=True, exist_ok=True)
        r.result_path.write_text("{}")
    (tmp_path / "res" / "initial.json").write_text("{}")
    # the model does not exist and python cannot start: nothing may be attempted
    outcome = run_grid(grid, p, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res", python="/nonexistent/py")
    assert outcome.skipped == [r.key for r in plan] and outcome.done == [] and outcome.failed == []


FAKE_EVAL = """#!/bin/sh
# stands in for `python -m deploy eval ... --set run.output_dir=DIR`: copies $EVAL_JSON to DIR/eval/eval.json
[ -n "$FAIL_EVAL" ] && exit 4
out=""; for a in "$@"; do case "$a" in run.output_dir=*) out=$(echo "${a#run.output_dir=}" | tr -d '"');; esac; done
mkdir -p "$out/eval" && cat "$EVAL_JSON" > "$out/eval/eval.json"
"""


def test_the_initial_model_is_evaluated_once_before_the_runs(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    p = _write(tmp_path, VALID.replace("/models/x", str(model)))
    grid = load_grid(p)
    for r in plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res"):
        r.result_path.parent.mkdir(parents=True, exist_ok=True)
        r.result_path.write_text("{}")  # every run done: only the initial evaluation is missing
    fake = tmp_path / "python"
    fake.write_text(FAKE_EVAL)
    fake.chmod(0o755)
    monkeypatch.setenv("EVAL_JSON", str(tmp_path / "e.json"))
    (tmp_path / "e.json").write_text(_eval({"t1": 0.0, "t2": 0.5}, label="eval").model_dump_json())
    kw = {"runs_dir": tmp_path / "runs", "results_dir": tmp_path / "res", "python": str(fake), "cwd": tmp_path}
    monkeypatch.setenv("FAIL_EVAL", "1")
    outcome = run_grid(grid, p, **kw)
    assert outcome.failed == ["initial"] and not (tmp_path / "res" / "initial.json").exists()
    monkeypatch.delenv("FAIL_EVAL")
    outcome = run_grid(grid, p, **kw)
    assert outcome.failed == [] and outcome.done == []
    initial = InitialResult.model_validate_json((tmp_path / "res" / "initial.json").read_text())
    assert initial.eval.per_task == {"t1": 0.0, "t2": 0.5} and initial.model_sha256 == model_digest(model)
    cmd = (tmp_path / "runs" / "initial.log").read_text().splitlines()[-1]
    assert f" -m deploy eval --config {ROOT}/deploy/configs/smoke_cpu.yaml --checkpoint {model} --k 2 " in cmd
    assert "--set eval.num_tasks=4" in cmd and f'--set run.output_dir="{tmp_path}/runs/initial"' in cmd
    log_before = (tmp_path / "runs" / "initial.log").read_text()
    run_grid(grid, p, **kw)  # evaluated once
    assert (tmp_path / "runs" / "initial.log").read_text() == log_before


def test_collect_result_reads_a_finished_run(tmp_path):
    p = _write(tmp_path, VALID)
    grid = load_grid(p)
    run = plan_runs(grid, runs_dir=tmp_path / "runs", results_dir=tmp_path / "res")[3]
    d = run.run_dir
    (d / "eval").mkdir(parents=True)
    (d / "config.resolved.json").write_text(json.dumps({"run": {"total_steps": 2}}))
    (d / "metrics.jsonl").write_text('{"step": 1, "success_rate": 0.25}\n{"step": 2, "success_rate": 0.5}\n')
    (d / "eval" / "step_0000.json").write_text(_eval({"t1": 0.0, "t2": 0.5}, label="step_0000").model_dump_json())
    (d / "eval" / "step_0002.json").write_text(_eval({"t1": 1.0, "t2": 0.5}, label="step_0002").model_dump_json())
    (d / "eval" / "step_0002-train.json").write_text(_eval({"t9": 1.0}, split="train").model_dump_json())
    (d / "experiment_seconds.json").write_text('{"seconds": 90.0}')
    r = collect_result(grid, run, base=Path("b.yaml"), sets=["x=1"], commit="abc")
    assert (r.arm, r.seed, r.total_steps, r.seconds, r.commit) == ("smrc", 1, 2, 90.0, "abc")
    assert [(c.step, c.value) for c in r.success_curve] == [(1, 0.25), (2, 0.5)]
    assert [(c.step, c.value) for c in r.eval_curve] == [(0, 0.25), (2, 0.75)]
    assert r.final_eval.per_task == {"t1": 1.0, "t2": 0.5}


# ---- statistics on synthetic runs (numbers checked by hand in the comments) ----------------------

def _eval(per_task: dict[str, float], *, split: str = "valid_unseen", label: str = "step_0002") -> EvalResult:
    avg = sum(per_task.values()) / len(per_task)
    return EvalResult(label=label, split=split, num_tasks=len(per_task), k=2, temperature=0.4, avg_at_k=avg,
                      avg_at_k_se=0.0, pass_at_k=sum(v > 0 for v in per_task.values()) / len(per_task),
                      per_task_type={}, num_episodes=2 * len(per_task), end_reasons={}, policy_version=2,
                      per_task=per_task)


def _run(arm: str, seed: int, per_task: dict[str, float], curve=(0.0, 0.5), seconds=60.0) -> RunResult:
    return RunResult(grid="g", arm=arm, seed=seed, total_steps=2, final_eval=_eval(per_task),
                     success_curve=[CurvePoint(step=i + 1, value=v) for i, v in enumerate(curve)], eval_curve=[],
                     base="b", overrides=[], config={}, commit="c", seconds=seconds)


REF = [_run("grpo", 0, {"t1": 0.0, "t2": 0.5}), _run("grpo", 1, {"t1": 0.5, "t2": 0.5})]
ARM = [_run("smrc", 0, {"t1": 1.0, "t2": 0.5}, curve=(0.5, 1.0)), _run("smrc", 1, {"t1": 0.5, "t2": 1.0}),
       _run("smrc", 2, {"t1": 0.0, "t2": 0.0}, seconds=180.0)]


def test_mean_and_se_over_seeds():
    assert mean_se([1.0]) == (1.0, None)
    m, se = mean_se([0.5, 0.25, 0.75])  # sd 0.25, s.e. 0.25 / sqrt(3)
    assert m == pytest.approx(0.5) and se == pytest.approx(0.25 / math.sqrt(3))
    s = summarize_arm("smrc", ARM)  # Avg@k per seed: 0.75, 0.75, 0.0 -> mean 0.5, sd sqrt(0.1875)
    assert s.seeds == [0, 1, 2] and s.per_seed_avg_at_k == [0.75, 0.75, 0.0]
    assert s.avg_at_k == pytest.approx(0.5) and s.avg_at_k_se == pytest.approx(math.sqrt(0.1875) / math.sqrt(3))
    assert s.pass_at_k == pytest.approx(2 / 3) and s.minutes_per_run == pytest.approx(5 / 3)  # (60+60+180)/3 s


def test_paired_difference_over_tasks_on_common_seeds():
    p = paired_vs_reference("smrc", ARM, "grpo", REF, n_boot=2000)
    # common seeds 0, 1 (smrc's seed 2 has no grpo partner); per-task means over them:
    # smrc t1 (1.0+0.5)/2 = 0.75, t2 0.75; grpo t1 0.25, t2 0.5 -> differences 0.5 and 0.25
    assert p.seeds == [0, 1] and p.num_tasks == 2
    assert p.mean == pytest.approx(0.375) and p.se == pytest.approx(0.125)  # sd 0.25/sqrt(2), / sqrt(2)
    # two tasks: every bootstrap mean is 0.25, 0.375 or 0.5 (0.25 and 0.5 each with chance 1/4)
    assert (p.lo, p.hi) == (pytest.approx(0.25), pytest.approx(0.5))
    assert paired_vs_reference("smrc", ARM[2:], "grpo", REF) is None
    other = [_run("grpo", 0, {"t1": 0.0, "t3": 0.5})]
    with pytest.raises(ValueError, match="different tasks"):
        paired_vs_reference("smrc", ARM, "grpo", other)


def test_learning_curve_band():
    steps, means, ses = curve_band(ARM[:2])  # curves (0.5, 1.0) and (0.0, 0.5)
    assert steps == [1, 2] and means == pytest.approx([0.25, 0.75]) and ses == pytest.approx([0.25, 0.25])


def test_report_files(tmp_path):
    table, summary_path = write_report("g", ["grpo", "smrc", "other"], "grpo", [*REF, *ARM], tmp_path,
                                       expected=["grpo_seed0", "grpo_seed1", "grpo_seed2", "smrc_seed0"], k=2,
                                       comparisons=[("grpo", "smrc"), ("other", "grpo")])
    assert "| smrc | 0,1,2 | 0.500 ± 0.250 |" in table
    assert "+0.375 ± 0.125 (n=2 tasks, seeds 0,1)" in table and "[+0.250, +0.500]" in table
    assert "Not finished yet: grpo_seed2." in table
    assert "| grpo - smrc | -0.375 ± 0.125 | [-0.500, -0.250] | 2 | 0,1 |" in table  # "other" has no run
    summary = json.loads(summary_path.read_text())
    assert summary["paired_vs_reference"]["smrc"]["mean"] == pytest.approx(0.375)
    assert [(c["arm"], c["reference"]) for c in summary["comparisons"]] == [("grpo", "smrc")]
    assert [a["arm"] for a in summary["arms"]] == ["grpo", "smrc"] and summary["missing"] == ["grpo_seed2"]
    assert (tmp_path / "curves.png").stat().st_size > 1000 and (tmp_path / "README.md").read_text() == table


def test_report_compares_every_arm_with_the_initial_model(tmp_path):
    runs = [r.model_copy(update={"model_sha256": "m"}) for r in [*REF, *ARM]]
    initial = InitialResult(grid="g", eval=_eval({"t1": 0.0, "t2": 0.5}, label="eval"), commit="c", seconds=9.0,
                            model_sha256="m")
    table, summary_path = write_report("g", ["grpo", "smrc"], "grpo", runs, tmp_path, expected=[], k=2,
                                       initial=initial)
    # per-task means over all seeds: smrc t1 0.5, t2 0.5; grpo t1 0.25, t2 0.5; initial t1 0.0, t2 0.5
    assert "Initial model, before training (the same evaluation): Avg@2 0.250" in table
    assert "| smrc - initial | +0.250 ± 0.250 | [+0.000, +0.500] | 2 | 0,1,2 |" in table
    assert "| grpo - initial | +0.125 ± 0.125 | [+0.000, +0.250] | 2 | 0,1 |" in table
    summary = json.loads(summary_path.read_text())
    assert summary["initial"]["avg_at_k"] == pytest.approx(0.25)
    assert summary["paired_vs_initial"]["smrc"]["mean"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="initial.json"):  # evaluated from another model
        write_report("g", ["grpo"], "grpo", runs, tmp_path, expected=[], k=2,
                     initial=initial.model_copy(update={"model_sha256": "other"}))


def test_cli_refuses_a_bad_grid_naming_the_key(tmp_path):
    from typer.testing import CliRunner

    from deploy.cli import app

    bad = _write(tmp_path, VALID.replace("seeds: [0, 1, 2]", "seeds: [0]"))
    res = CliRunner().invoke(app, ["experiment", "run", "--grid", str(bad), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "seeds" in res.output and "min_seeds=3" in res.output
    good = _write(tmp_path, VALID)
    res = CliRunner().invoke(app, ["experiment", "run", "--grid", str(good), "--seeds", "0,x"])
    assert res.exit_code == 2 and "--seeds '0,x'" in res.output
    res = CliRunner().invoke(app, ["experiment", "report", "--grid", str(good), "--results", str(tmp_path / "none")])
    assert res.exit_code == 0 and "no finished run of grid g1" in res.output


def test_grid_outputs_stay_under_runs_unless_published(tmp_path, monkeypatch):
    """A grid writes (and `report` reads) runs/experiments/<grid>/results/; only --publish uses the
    committed results/<grid>/."""
    from typer.testing import CliRunner

    from deploy.cli import app
    from deploy.experiment.grid import default_dirs

    assert default_dirs("g1", publish=False) == (Path("runs/experiments/g1"), Path("runs/experiments/g1/results"))
    assert default_dirs("g1", publish=True) == (Path("runs/experiments/g1"), Path("results/g1"))
    good = _write(tmp_path, VALID)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["experiment", "report", "--grid", str(good)])
    assert res.exit_code == 0 and "under runs/experiments/g1/results/ yet" in res.output
    res = CliRunner().invoke(app, ["experiment", "report", "--grid", str(good), "--publish"])
    assert res.exit_code == 0 and "under results/g1/ yet" in res.output
    res = CliRunner().invoke(app, ["experiment", "run", "--grid", str(good), "--publish", "--results", "x"])
    assert res.exit_code == 2 and "not both" in res.output
    assert not (tmp_path / "results").exists() and not (tmp_path / "x").exists()
