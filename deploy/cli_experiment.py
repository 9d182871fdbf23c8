"""`python -m deploy experiment ...`: run a grid of arms x seeds and report it (deploy/experiment/,
docs/testbed.md "Running a grid"). Runs and results go to runs/experiments/<grid>/ unless --publish
sends the results to the committed results/<grid>/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploy.errors import UserError

experiment_app = typer.Typer(no_args_is_help=True, help="Multi-seed method grids: arms x seeds of training runs.")

GridOpt = Annotated[Path, typer.Option("--grid", "-g", help="grid file (deploy/experiments/*.yaml)")]
OutOpt = Annotated[Path | None, typer.Option(help="run directories (default runs/experiments/<grid>)")]
ResultsOpt = Annotated[Path | None, typer.Option(
    "--results", help="per-run JSON and the report (default runs/experiments/<grid>/results)")]
PublishOpt = Annotated[bool, typer.Option(
    "--publish", help="results in the committed results/<grid>/ instead of runs/experiments/<grid>/results/")]


def _grid(path: Path):
    from deploy.experiment.grid import load_grid

    return load_grid(path)


def _dirs(grid, out: Path | None, results: Path | None, publish: bool) -> tuple[Path, Path]:
    """(run directories, results directory): the options given, else the grid's defaults."""
    from deploy.experiment.grid import default_dirs

    if publish and results is not None:
        raise UserError("give --results DIR or --publish (results/<grid>/), not both")
    runs_dir, results_dir = default_dirs(grid.name, publish=publish)
    return out or runs_dir, results or results_dir


def _report(grid, results: Path, runs_dir: Path) -> None:
    from deploy.experiment.grid import initial_run, plan_runs
    from deploy.experiment.report import InitialResult, load_results, write_report

    plan = plan_runs(grid, runs_dir=runs_dir, results_dir=results)
    found = load_results([r.result_path for r in plan])
    initial_path = initial_run(grid, runs_dir=runs_dir, results_dir=results).result_path
    initial = InitialResult.model_validate_json(initial_path.read_text()) if initial_path.is_file() else None
    if not found:
        typer.secho(f"no finished run of grid {grid.name} under {results}/ yet", fg="yellow", err=True)
        return
    try:
        table, summary = write_report(grid.name, list(grid.arms), grid.reference_arm, found, results,
                                      expected=[r.key for r in plan], k=grid.eval.k, comparisons=grid.comparisons,
                                      initial=initial)
    except ValueError as err:
        raise UserError(str(err)) from err
    typer.echo(table)
    typer.echo(f"wrote {results / 'README.md'}, {results / 'curves.png'} and {summary}")


@experiment_app.command("run")
def run(grid_file: GridOpt, out: OutOpt = None, results: ResultsOpt = None, publish: PublishOpt = False,
        only: Annotated[list[str] | None, typer.Option(help="only this arm; repeatable")] = None,
        seeds: Annotated[str | None, typer.Option(help="only these seeds, comma-separated (e.g. 0,1)")] = None) -> None:
    """Train every (arm, seed) of the grid without a results JSON yet (resuming from checkpoints), then report."""
    from rich.console import Console

    from deploy.experiment.runner import run_grid

    grid = _grid(grid_file)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()] if seeds is not None else None
    except ValueError:
        raise UserError(f"--seeds {seeds!r}: give comma-separated integers, e.g. 0,1") from None
    runs_dir, results_dir = _dirs(grid, out, results, publish)
    console = Console(stderr=True)
    outcome = run_grid(grid, grid_file, runs_dir=runs_dir, results_dir=results_dir, only=only, seeds=seed_list,
                       log=lambda line: console.print(line, markup=False, highlight=False))
    console.print(f"grid {grid.name}: {len(outcome.done)} run(s) finished now, {len(outcome.skipped)} already done "
                  f"(results JSON present in {results_dir}), {len(outcome.failed)} failed")
    _report(grid, results_dir, runs_dir)
    if outcome.failed:
        typer.secho(f"failed: {', '.join(outcome.failed)}; run the same command again to resume them", fg="red", err=True)
        raise typer.Exit(1)


@experiment_app.command("report")
def report(grid_file: GridOpt, out: OutOpt = None, results: ResultsOpt = None, publish: PublishOpt = False) -> None:
    """Results table (mean ± s.e. over seeds, paired differences vs the reference arm), curves PNG, summary.json."""
    grid = _grid(grid_file)
    runs_dir, results_dir = _dirs(grid, out, results, publish)
    _report(grid, results_dir, runs_dir)
