"""Running a grid: every planned (arm, seed) as its own `python -m deploy train` subprocess, one after
another. A subprocess per run survives what an in-process run would not (a Ray or engine crash, a
leaked actor, an out-of-memory kill): the grid goes on with the next run and reports the failure.

Resumable: a run whose results JSON exists is skipped; a run dir with a checkpoint resumes from it
(`train --resume`, the trainer's own resume: same task stream); a run dir without a checkpoint is
moved aside (<run>.crashed-N) and trained afresh. The results JSON is written the moment a run
and its grid `analyses` finish (`run_analyses`), so a crash loses at most the run in progress.
Before the first run, the initial model is evaluated once as the runs' final evaluations are
(`evaluate_initial`, grid `initial_eval`), so the report can say what training added.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deploy.config_loading import ConfigError, load_config
from deploy.evaluation import EvalResult
from deploy.experiment.grid import (
    GridError,
    GridSpec,
    PlannedRun,
    base_config_path,
    expand_vars,
    final_eval_path,
    initial_run,
    plan_runs,
    run_overrides,
    run_state,
)
from deploy.experiment.report import CurvePoint, InitialResult, RunResult

Log = Callable[[str], None]


def model_dir(grid: GridSpec) -> Path:
    """Where the initial model is (or will be, for a `build:` grid); `${VAR}`s expanded."""
    if grid.model.path is not None:
        return Path(expand_vars(grid.model.path, "model.path"))
    b = grid.model.build
    out = Path(expand_vars(b.out, "model.build.out"))
    return out / b.model_subdir if b.model_subdir else out


def ensure_model(grid: GridSpec, *, python: str, log: Log) -> str:
    """The initial model's directory; with `model.build` runs `deploy testbed build` once (skipped when
    the model is already there)."""
    path = model_dir(grid)
    b = grid.model.build
    marker = Path(expand_vars(b.out, "model.build.out")) / b.done_marker if b is not None and b.done_marker else None
    if (path / "config.json").is_file() and (marker is None or marker.is_file()):
        return str(path.resolve())
    if b is None:
        raise GridError(f"model.path={grid.model.path!r} -> {path} holds no config.json: point it at an HF model "
                        "directory (the testbed build's model) or use model.build")
    try:
        help_ = subprocess.run([python, "-m", "deploy", "testbed", "build", "--help"], capture_output=True,
                               text=True, timeout=300, check=False)
    except OSError as err:
        raise GridError(f"model.build: cannot start {python} ({err})") from None
    if help_.returncode != 0:
        raise GridError("model.build runs `python -m deploy testbed build`, which this checkout does not have; "
                        "set model.path to an HF model directory instead")
    out = expand_vars(b.out, "model.build.out")
    cmd = [python, "-m", "deploy", "testbed", "build", "--out", out, *b.args]
    log(f"building the initial model: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode != 0:
        raise GridError(f"`{' '.join(cmd)}` failed; fix it or set model.path")
    if not (path / "config.json").is_file() or (marker is not None and not marker.is_file()):
        raise GridError(f"`deploy testbed build` wrote no {path}/config.json or no {marker}; set "
                        "model.build.model_subdir (the model directory inside model.build.out) and done_marker")
    return str(path.resolve())


def run_args(grid: GridSpec, grid_file: Path, run: PlannedRun, model_path: str) -> tuple[Path, list[str]]:
    """The base config and `--set` strings of one run, validated (a bad arm fails before any run starts).
    UniSkill runs get their own skill-bank key prefix (the run name)."""
    base = base_config_path(grid, grid_file)
    sets = run_overrides(grid, run, model_path)
    try:
        cfg = load_config(base, sets)
    except ConfigError as err:
        raise GridError(f"grid {grid.name}, arm {run.arm} (seed {run.seed}): {err}") from None
    if cfg.uniskill.enabled:
        sets.append(f"uniskill.bank.key_prefix={json.dumps(cfg.run.name)}")
    return base, sets


def train_command(python: str, base: Path, sets: list[str], *, resume: bool) -> list[str]:
    """`python -m deploy train` of one run; `--resume` continues from its latest checkpoint."""
    cmd = [python, "-m", "deploy", "train", "--config", str(base), *(x for s in sets for x in ("--set", s))]
    return [*cmd, "--resume"] if resume else cmd


def git_commit(cwd: Path) -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def model_digest(model_path: str | Path) -> str:
    """sha256 over the model directory's weight files (*.safetensors, *.bin; sorted by name)."""
    files = sorted(p for p in Path(model_path).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise GridError(f"{model_path}: no *.safetensors or *.bin weight file to fingerprint")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _step_of(label: str) -> int | None:
    head = label.split("-", 1)[0]
    return int(head[5:]) if head.startswith("step_") and head[5:].isdigit() else None


def collect_result(grid: GridSpec, run: PlannedRun, *, base: Path, sets: list[str], commit: str,
                   model_sha256: str | None = None) -> RunResult:
    """Read a finished run's directory into its RunResult."""
    d = run.run_dir
    config = json.loads((d / "config.resolved.json").read_text())
    total = int(config["run"]["total_steps"])
    final = final_eval_path(d, total, grid.eval.split)
    if final is None:
        raise GridError(f"{d}: no final evaluation eval/step_{total:04d}.json; the run did not finish")
    lines = (d / "metrics.jsonl").read_text().splitlines() if (d / "metrics.jsonl").exists() else []
    steps = [json.loads(line) for line in lines if line.strip()]
    evals = [EvalResult.model_validate_json(p.read_text()) for p in sorted((d / "eval").glob("step_*.json"))]
    eval_curve = sorted((CurvePoint(step=s, value=e.avg_at_k) for e in evals
                         if e.split == grid.eval.split and (s := _step_of(e.label)) is not None),
                        key=lambda p: p.step)
    seconds_file = d / "experiment_seconds.json"
    seconds = json.loads(seconds_file.read_text())["seconds"] if seconds_file.exists() else 0.0
    return RunResult(grid=grid.name, arm=run.arm, seed=run.seed, total_steps=total,
                     final_eval=EvalResult.model_validate_json(final.read_text()),
                     success_curve=[CurvePoint(step=int(r["step"]), value=float(r["success_rate"])) for r in steps
                                    if "success_rate" in r],
                     eval_curve=eval_curve, base=str(base), overrides=sets, config=config, commit=commit,
                     seconds=seconds, model_sha256=model_sha256)


def run_analyses(grid: GridSpec, run: PlannedRun, *, results_dir: Path, python: str, cwd: Path, log_path: Path,
                 log: Log) -> None:
    """The grid's `analyses` of `run.arm` on the finished run (each once: a `<subcommand>.done` file
    in the destination records it); the JSON and PNG files each writes to RUN/analysis/ are copied to
    results/<grid>/analysis/<arm>_seed<k>/. An analysis that fails is tried once more; if it fails
    again its exit code and log tail go to `<subcommand>.failed` and the run still counts (an
    analysis that cannot succeed, e.g. a step without proposals, must not make the grid retrain the
    run); the closing record shows the gap, and collecting the run again retries it."""
    dest = results_dir / "analysis" / run.key
    for command in grid.analyses.get(run.arm, []):
        words = shlex.split(command)
        done = dest / f"{words[0]}.done"
        if done.is_file():
            continue
        cmd = [python, "-m", "deploy", "analyze", *words, "--run", str(run.run_dir)]
        started, clock = time.time(), time.perf_counter()
        dest.mkdir(parents=True, exist_ok=True)
        for _attempt in range(2):
            with log_path.open("a") as out:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
            if rc == 0:
                break
        if rc != 0:
            tail = log_path.read_text().splitlines()[-15:]
            (dest / f"{words[0]}.failed").write_text(json.dumps({"command": cmd[3:], "exit": rc, "log_tail": tail},
                                                                indent=2) + "\n")
            log(f"    {run.key}: `deploy analyze {command}` failed twice (exit {rc}); recorded in "
                f"{dest / (words[0] + '.failed')}. Log {log_path}:\n" + "\n".join(tail))
            continue
        copied = [f.name for f in sorted((run.run_dir / "analysis").glob("*"))
                  if f.is_file() and f.suffix in (".json", ".png") and f.stat().st_mtime >= started - 1]
        for name in copied:
            shutil.copy2(run.run_dir / "analysis" / name, dest / name)
        (dest / f"{words[0]}.failed").unlink(missing_ok=True)
        done.write_text(json.dumps({"command": cmd[3:], "files": copied,
                                    "seconds": time.perf_counter() - clock}, indent=2) + "\n")
        log(f"    {run.key}: analyze {words[0]} -> {dest} ({', '.join(copied) or 'no files'})")


def evaluate_initial(grid: GridSpec, grid_file: Path, *, runs_dir: Path, results_dir: Path, model_path: str,
                     python: str, cwd: Path, commit: str, model_sha256: str, log: Log) -> bool:
    """`deploy eval` of the initial model with the grid's evaluation (one process, like a run's), written
    to results/<grid>/initial.json; False (logged) when it fails, so the next `experiment run` retries."""
    run = initial_run(grid, runs_dir=runs_dir, results_dir=results_dir)
    base, sets = run_args(grid, grid_file, run, model_path)
    cmd = [python, "-m", "deploy", "eval", "--config", str(base), "--checkpoint", model_path, "--k", str(grid.eval.k),
           *(x for s in sets for x in ("--set", s))]
    log(f"[initial] evaluating the initial model ({grid.eval.num_tasks} {grid.eval.split} tasks x k={grid.eval.k})")
    runs_dir.mkdir(parents=True, exist_ok=True)
    log_path = runs_dir / "initial.log"
    start = time.perf_counter()
    with log_path.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    found = [e for p in sorted((run.run_dir / "eval").glob("eval*.json"))
             if (e := EvalResult.model_validate_json(p.read_text())).split == grid.eval.split] if rc == 0 else []
    if not found:
        tail = "\n".join(log_path.read_text().splitlines()[-15:])
        log(f"    initial evaluation failed (exit {rc}); the next `experiment run` retries it. Log {log_path}:\n{tail}")
        return False
    result = InitialResult(grid=grid.name, eval=found[0], commit=commit, seconds=time.perf_counter() - start,
                           model_sha256=model_sha256)
    write_json_atomic(run.result_path, result.model_dump_json(indent=2) + "\n")
    log(f"    initial model: Avg@{grid.eval.k} {result.eval.avg_at_k:.3f} -> {run.result_path}")
    return True


def write_json_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _add_seconds(run_dir: Path, seconds: float) -> None:
    f = run_dir / "experiment_seconds.json"
    before = json.loads(f.read_text())["seconds"] if f.exists() else 0.0
    if run_dir.is_dir():
        f.write_text(json.dumps({"seconds": before + seconds}))


def move_aside(run_dir: Path) -> Path:
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.crashed-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    return aside


@dataclass
class GridOutcome:
    done: list[str] = field(default_factory=list)
    """Runs finished in this sitting."""
    skipped: list[str] = field(default_factory=list)
    """Runs whose results JSON already existed."""
    failed: list[str] = field(default_factory=list)
    """Runs whose `deploy train` exited non-zero (their logs: runs dir/<arm>_seed<k>.log)."""


def run_grid(grid: GridSpec, grid_file: Path, *, runs_dir: Path, results_dir: Path, only: list[str] | None = None,
             seeds: list[int] | None = None, python: str = sys.executable, log: Log = print,
             cwd: Path | None = None) -> GridOutcome:
    """Train every planned run that has no results JSON yet; see the module docstring."""
    cwd = cwd or Path.cwd()
    runs_dir, results_dir = cwd / runs_dir, cwd / results_dir  # the train processes run in cwd
    plan = plan_runs(grid, runs_dir=runs_dir, results_dir=results_dir, only=only, seeds=seeds)
    todo = [r for r in plan if not r.result_path.is_file()]
    outcome = GridOutcome(skipped=[r.key for r in plan if r.result_path.is_file()])
    need_initial = grid.initial_eval and not initial_run(grid, runs_dir=runs_dir, results_dir=results_dir).result_path.is_file()
    if not todo and not need_initial:
        return outcome
    expected_model = str(model_dir(grid).resolve())
    args = {r.key: run_args(grid, grid_file, r, expected_model) for r in todo}  # every arm validated first
    model_path = ensure_model(grid, python=python, log=log)
    if model_path != expected_model:  # pragma: no cover - model_dir and ensure_model agree
        args = {r.key: run_args(grid, grid_file, r, model_path) for r in todo}
    commit, digest = git_commit(cwd), model_digest(model_path)
    log(f"initial model {model_path} (sha256 {digest[:12]})")
    if need_initial and not evaluate_initial(grid, grid_file, runs_dir=runs_dir, results_dir=results_dir,
                                             model_path=model_path, python=python, cwd=cwd, commit=commit,
                                             model_sha256=digest, log=log):
        outcome.failed.append("initial")
    grid_start = time.perf_counter()
    for i, run in enumerate(todo, 1):
        base, sets = args[run.key]
        total = int(load_config(base, sets).run.total_steps)
        state = run_state(run, total, grid.eval.split)
        log(f"[{i}/{len(todo)}] {run.key}: {state}")
        if state == "restart":
            log(f"    {run.run_dir} holds no checkpoint: moved to {move_aside(run.run_dir)}")
        if state != "collect":
            cmd = train_command(python, base, sets, resume=state == "resume")
            runs_dir.mkdir(parents=True, exist_ok=True)
            log_path = runs_dir / f"{run.key}.log"
            start = time.perf_counter()
            with log_path.open("a") as out:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
            _add_seconds(run.run_dir, time.perf_counter() - start)
            if rc != 0:
                tail = "\n".join(log_path.read_text().splitlines()[-15:])
                log(f"    {run.key} failed (exit {rc}); the next `experiment run` resumes it. Log {log_path}:\n{tail}")
                outcome.failed.append(run.key)
                continue
        run_analyses(grid, run, results_dir=results_dir, python=python, cwd=cwd, log_path=runs_dir / f"{run.key}.log",
                     log=log)
        result = collect_result(grid, run, base=base, sets=sets, commit=commit, model_sha256=digest)
        write_json_atomic(run.result_path, result.model_dump_json(indent=2) + "\n")
        outcome.done.append(run.key)
        per_run = (time.perf_counter() - grid_start) / i
        log(f"    {run.key}: Avg@{grid.eval.k} {result.final_eval.avg_at_k:.3f} in {result.seconds / 60:.1f} min "
            f"-> {run.result_path}; about {per_run * (len(todo) - i) / 60:.0f} min left for {len(todo) - i} run(s)")
    return outcome
