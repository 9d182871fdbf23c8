"""`python -m deploy testbed ...`: the laptop testbed: build the context-literate cold start,
then measure its in-context abilities on held-out tasks (docs/testbed.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from deploy.errors import UserError

testbed_app = typer.Typer(no_args_is_help=True, help="Context-literate cold start (build) and its abilities.")

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "demo_cpu.yaml"
"""The laptop demo's config: the default of `testbed build`, `sft` and `demo`, wherever they run from."""
EnvOpt = Annotated[str | None,
                   typer.Option("--env", help="a registered environment with ground-truth skills (alfworld, "
                                               "webshop; default: the config's env.name)")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config (build default: demo_cpu.yaml; "
                                                                      "abilities default: DIR/config.resolved.json)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="dotted override key=value; repeatable")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="print the frameworks' logs (vLLM, torch) on the console "
                                                            "instead of DIR/logs/")]


def _load(config: Path | None, overrides: list[str]):
    from deploy.config_loading import load_config

    return load_config(config, overrides)


def _env_set(env: str | None) -> list[str]:
    return [f"env.name={env}"] if env else []


def _route_logs(directory: Path, verbose: bool) -> None:
    from deploy.logs import route_logs

    log_dir = route_logs(directory, verbose=verbose)
    if log_dir is not None:
        typer.secho(f"framework logs: {log_dir}/ (--verbose prints them here)", dim=True, err=True)


@testbed_app.command("build")
def build(
    out: Annotated[Path, typer.Option("--out", help="output directory (DIR/model, DIR/build.json)")],
    env: EnvOpt = None,
    minutes: Annotated[float | None, typer.Option(
        "--minutes", help="optional cap on the SFT's wall clock: reaching it fails the build (default: sft.minutes, off)")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    corpus_episodes: Annotated[int, typer.Option(help="expert episodes in the tokenizer corpus")] = 200,
    verbose: VerboseOpt = False,
) -> None:
    """Tokenizer + tiny model + SFT on plain, teacher-block, skill and proposer turns (sft.*_fraction)."""
    from deploy.testbed.build import build_testbed, testbed_overrides

    if minutes is not None and minutes <= 0:
        raise UserError(f"--minutes must be > 0, got {minutes}")
    cfg = _load(config or DEFAULT_CONFIG, [*testbed_overrides(), *_env_set(env), *(set_ or [])])
    if cfg.rollout.use_think:
        raise UserError("SFT targets carry no reasoning: set rollout.use_think=false")
    _route_logs(out, verbose)
    record = build_testbed(cfg, out, minutes=minutes, corpus_episodes=corpus_episodes)
    typer.echo(f"testbed model written to {record['model']} ({record['seconds']['total'] / 60:.1f} min)")


def _model_dirs(model: Path) -> tuple[Path, Path]:
    """(the HF model directory, the directory holding build outputs): DIR/model inside a build
    directory, else DIR itself."""
    if (model / "model" / "config.json").exists():
        return model / "model", model
    if (model / "config.json").exists():
        return model, model
    raise UserError(f"--model {model}: neither {model}/config.json nor {model}/model/config.json exists; pass a "
                    "`testbed build --out` directory or an HF model directory")


@testbed_app.command("abilities")
def abilities(
    model: Annotated[Path, typer.Option("--model", help="a `testbed build` directory (or an HF model directory)")],
    env: EnvOpt = None,
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="held-out (valid_unseen) tasks")] = 30,
    seed: Annotated[int, typer.Option("--seed", help="detours, sampling and bootstrap seed")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="JSON path (default DIR/abilities.json)")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Teacher context gain, skill gain and proposer validity on held-out tasks (three lines)."""
    import os

    from rich.console import Console

    from deploy.testbed.abilities import ability_lines, teacher_gain_detail
    from deploy.testbed.skill_abilities import proposer_validity, skill_gain
    from envs.tasks import eval_tasks

    # stdout carries only the three lines: vLLM (run in this process) then logs through the root
    # logger, which `_route_logs` sends to DIR/logs/driver.log, instead of its own stdout handler
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    model_dir, home = _model_dirs(model)
    resolved = home / "config.resolved.json"
    cfg = _load(config or (resolved if resolved.exists() else DEFAULT_CONFIG),
                [*_env_set(env), f"model.path={model_dir}", *(set_ or [])])
    held_out = eval_tasks(cfg.env, "valid_unseen", tasks)
    _route_logs(home, verbose)
    console = Console(stderr=True)
    console.print(f"[bold]testbed abilities[/] {model_dir} env={cfg.env.name} tasks={len(held_out)} (valid_unseen)")
    try:
        with console.status("teacher context gain"):
            teacher = teacher_gain_detail(cfg, str(model_dir), held_out, seed=seed)
        with console.status("skill gain"):
            skill = skill_gain(cfg, str(model_dir), held_out, seed=seed)
        with console.status("proposer validity"):
            proposer = proposer_validity(cfg, str(model_dir), held_out, seed=seed)
    except ValueError as err:
        raise UserError(str(err)) from err
    path = out or home / "abilities.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": str(model_dir), "env": cfg.env.name, "split": "valid_unseen", "tasks": len(held_out),
              "seed": seed, "teacher_context_gain": teacher.to_json(),
              "skill_gain": {"mean": skill.mean, "lo": skill.lo, "hi": skill.hi, "n": skill.n,
                             "per_item": list(skill.per_item)},
              "proposer_valid": {"mean": proposer.mean, "lo": proposer.lo, "hi": proposer.hi, "n": proposer.n,
                                 "per_item": list(proposer.per_item), "samples": list(proposer.samples)}}
    path.write_text(json.dumps(record, indent=2))
    console.print(f"written {path}")
    for line in ability_lines(teacher.figure, skill, proposer):
        typer.echo(line)
