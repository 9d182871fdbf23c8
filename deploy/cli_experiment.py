"""`python -m deploy experiment ...`: run a grid of arms x seeds and report it (deploy/experiment/,
docs/testbed.md "Running a grid")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

experiment_app = typer.Typer(no_args_is_help=True, help="Multi-seed method grids: arms x seeds of training runs.")

GridOpt = Annotated[Path, typer.Option("--grid", "-g", help="grid file (deploy/experiments/*.yaml)")]
ResultsOpt = Annotated[Path | None, typer.Option("--results", help="per-run JSON and the report (default results/<grid>)")]


def _grid(path: Path):
    from deploy.experiment.grid import GridError, load_grid

    try:
        return load_grid(path)
    except GridError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(2) from None


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
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(table)
    typer.echo(f"wrote {results / 'README.md'}, {results / 'curves.png'} and {summary}")


@experiment_app.command("run")
def run(grid_file: GridOpt,
        out: Annotated[Path | None, typer.Option(help="run directories (default runs/experiments/<grid>)")] = None,
        results: ResultsOpt = None,
        only: Annotated[list[str] | None, typer.Option(help="only this arm; repeatable")] = None,
        seeds: Annotated[str | None, typer.Option(help="only these seeds, comma-separated (e.g. 0,1)")] = None) -> None:
    """Train every (arm, seed) of the grid without a results JSON yet (resuming from checkpoints), then report."""
    from rich.console import Console

    from deploy.experiment.grid import GridError
    from deploy.experiment.runner import run_grid

    grid = _grid(grid_file)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()] if seeds is not None else None
    except ValueError:
        typer.secho(f"--seeds {seeds!r}: give comma-separated integers, e.g. 0,1", fg="red", err=True)
        raise typer.Exit(2) from None
    runs_dir = out or Path("runs/experiments") / grid.name
    results = results or Path("results") / grid.name
    console = Console(stderr=True)
    try:
        outcome = run_grid(grid, grid_file, runs_dir=runs_dir, results_dir=results, only=only, seeds=seed_list,
                           log=lambda line: console.print(line, markup=False, highlight=False))
    except GridError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(2) from None
    console.print(f"grid {grid.name}: {len(outcome.done)} run(s) finished now, {len(outcome.skipped)} already done "
                  f"(results JSON present), {len(outcome.failed)} failed")
    _report(grid, results, runs_dir)
    if outcome.failed:
        typer.secho(f"failed: {', '.join(outcome.failed)}; run the same command again to resume them", fg="red", err=True)
        raise typer.Exit(1)


@experiment_app.command("report")
def report(grid_file: GridOpt, results: ResultsOpt = None) -> None:
    """Results table (mean ± s.e. over seeds, paired differences vs the reference arm), curves PNG, summary.json."""
    grid = _grid(grid_file)
    _report(grid, results or Path("results") / grid.name, Path("runs/experiments") / grid.name)
