"""`python -m deploy env ...`: game/catalogue generators and the parity tools (replay, record,
reward check). Each command is a thin shell over a function in envs/ (an environment's parity tools come from
its plugin, `EnvPlugin.parity()`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from deploy.errors import UserError

env_app = typer.Typer(no_args_is_help=True, help="Environment data generators and parity tools.")

@env_app.command("generate-alfworld")
def generate_alfworld(
    out: Annotated[Path, typer.Option(help="data root; games go to OUT/json_2.1.1/<split>/...")],
    num_games: Annotated[int, typer.Option(help="games to write")] = 30,
    seed: Annotated[int, typer.Option(help="layout seed")] = 0,
    split: Annotated[str, typer.Option(help="train | valid_seen | valid_unseen")] = "train",
) -> None:
    """Write ALFWorld games in the standard layout, each verified solvable by the real expert."""
    from envs.alfworld_real.generator import generate_games

    paths = generate_games(out, num_games=num_games, seed=seed, split=split)
    typer.echo(f"wrote {len(paths)} games under {out / 'json_2.1.1' / split}")


@env_app.command("generate-webshop")
def generate_webshop(
    out: Annotated[Path, typer.Option(help="output folder (upstream file names)")],
    num_products: Annotated[int, typer.Option(help="products in the catalogue")] = 200,
    seed: Annotated[int, typer.Option(help="catalogue seed")] = 0,
) -> None:
    """Write a synthetic WebShop catalogue in the upstream raw JSON schemas."""
    from envs.webshop.generate import generate_catalogue

    files = generate_catalogue(out, num_products=num_products, seed=seed)
    typer.echo("wrote " + ", ".join(str(f) for f in files))


@env_app.command("replay")
def replay(
    env: Annotated[str, typer.Option(help="a registered environment (alfworld, webshop, scienceworld, ...)")],
    data_path: Annotated[Path | None, typer.Option(help="game / catalogue root the transcripts refer to")] = None,
    backend: Annotated[str, typer.Option(help="the env's backend (alfworld: embedded | alfworld; webshop: "
                                              "embedded | webshop)")] = "embedded",
    transcripts: Annotated[Path | None, typer.Option(help="JSONL transcripts to replay and compare")] = None,
    record: Annotated[Path | None, typer.Option(help="instead of replaying, record transcripts to this JSONL")] = None,
    env_meta: Annotated[Path | None, typer.Option(help="WebShop: recorded product prices and goal order")] = None,
    episodes: Annotated[int, typer.Option(help="--record: episodes to record")] = 20,
    seed: Annotated[int, typer.Option(help="--record: seed of the action mix")] = 0,
    max_steps: Annotated[int | None, typer.Option(help="--record: step limit (default: the env's)")] = None,
    env_kwargs: Annotated[str | None, typer.Option(
        help='WebShop --record: upstream env options as JSON, e.g. \'{"show_attrs": true}\' (written on '
             'every line; a replay applies each line\'s own "env_kwargs")')] = None,
    gold: Annotated[bool, typer.Option("--gold", help="replay the env's own gold action sequences and count "
                                                       "the wins (ScienceWorld)")] = False,
    tasks: Annotated[int, typer.Option(help="--gold: tasks to replay, spread over the task types")] = 30,
) -> None:
    """Replay recorded episodes on a backend and compare every step (or record new ones), or replay
    the env's gold action sequences (--gold). The tools are the env's own (`EnvPlugin.parity()`)."""
    tool = _parity_tool(env)
    if gold:
        _gold(env, tool, tasks)
        return
    if (transcripts is None) == (record is None):
        raise UserError("give exactly one of --transcripts FILE (replay) or --record FILE (or --gold)")
    if not hasattr(tool, "replay"):
        raise UserError(f"env {env!r} has no transcript replay; its parity tool offers --gold only")
    options = _env_kwargs(env, tool, env_kwargs)
    if data_path is None:
        raise UserError("--data-path is required with --transcripts / --record: the game / catalogue root")
    how = _record_hint(env, data_path)
    _require_file(transcripts, "--transcripts", f"record transcripts with `{how}`")
    _require_file(env_meta, "--env-meta", "give the JSON of upstream's product prices and goal order "
                                          "(envs/webshop/parity.py describes it)")
    if not data_path.exists():
        raise UserError(f"--data-path {data_path} does not exist: point it at the game / catalogue root "
                        "(`python -m deploy env generate-alfworld` or `generate-webshop` writes one)")
    try:
        if record is not None:
            extra = {"env_kwargs": options} if options else {}
            n = tool.record(backend=backend, data_path=data_path, out=record, episodes=episodes, seed=seed,
                            max_steps=max_steps, **extra)
            typer.echo(f"recorded {n} episodes to {record}")
            return
        report = tool.replay(backend=backend, data_path=data_path, transcripts=transcripts, env_meta=env_meta)
    except (ValueError, TypeError) as err:  # a malformed transcript, env meta or option: named, no traceback
        fix = f" (transcripts come from `{how}`)" if transcripts is not None else ""
        raise UserError(f"{err}{fix}") from err
    for line in report.lines():
        typer.echo(line)
    if report.identical_steps != report.total_steps:
        raise typer.Exit(1)


def _parity_tool(env: str):
    """The env's parity tool; a UserError for an unregistered env or one without a tool."""
    from envs.registry import get_plugin

    try:
        plugin = get_plugin(env)
    except ValueError as err:
        raise UserError(str(err).replace("env.name=", "--env ")) from None
    tool = plugin.parity()
    if tool is None:
        raise UserError(f"env {env!r} has no parity tools (its plugin's parity() is None)")
    return tool


def _gold(env: str, tool, tasks: int) -> None:
    if not hasattr(tool, "gold_replay"):
        raise UserError(f"--gold: env {env!r} has no gold action sequences; replay transcripts instead "
                        "(--transcripts FILE)")
    if tasks < 1:
        raise UserError(f"--tasks must be >= 1, got {tasks}")
    try:
        result = tool.gold_replay(num_tasks=tasks)
    except (ValueError, RuntimeError) as err:  # e.g. a missing Java runtime: one line, how to fix it
        raise UserError(str(err)) from err
    for line in result.failures:
        typer.echo(line)
    typer.echo(f"{result.total} tasks over {result.task_types} task types")
    typer.echo(f"{env} gold replay: {result.won}/{result.total} won")
    if result.won != result.total:
        raise typer.Exit(1)


def _record_hint(env: str, data_path: Path) -> str:
    """The command that records transcripts for `env replay` to compare."""
    return f"python -m deploy env replay --env {env} --data-path {data_path} --record FILE"


def _require_file(path: Path | None, option: str, fix: str) -> None:
    if path is not None and not path.is_file():
        raise UserError(f"{option} {path} is not a file: {fix}")


def _env_kwargs(env: str, tool, text: str | None) -> dict:
    if text is None:
        return {}
    if not getattr(tool, "ACCEPTS_ENV_KWARGS", False):
        raise UserError(f"--env-kwargs does not apply to --env {env} (its recorder takes no upstream options)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"--env-kwargs is not JSON ({err.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise UserError(f"--env-kwargs must be a JSON object, got {text!r}")
    return value


@env_app.command("webshop-reward")
def webshop_reward(cases: Annotated[Path, typer.Option(help="JSONL reward cases")]) -> None:
    """Check the embedded WebShop reward on recorded cases; ends with `matching rewards: X/Y`."""
    from envs.webshop.parity import check_rewards

    what = ("a JSONL file, one reward case a line: {goal, purchased_product, selected_options, price, "
            "result} recorded from upstream WebShop's get_reward")
    _require_file(cases, "--cases", f"pass {what}")
    try:
        matched, total, lines = check_rewards(cases)
    except (ValueError, TypeError) as err:
        raise UserError(f"{err}: --cases must be {what}") from err
    for line in lines:
        typer.echo(line)
    typer.echo(f"matching rewards: {matched}/{total}")
    if matched != total:
        raise typer.Exit(1)
