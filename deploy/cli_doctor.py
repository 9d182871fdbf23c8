"""`python -m deploy doctor`: the checklist of `deploy.doctor` for a config, one line per check;
exit 1 when a need is unmet. `train` runs the same checks first (`require_preflight`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from deploy.errors import UserError

if TYPE_CHECKING:
    from deploy.config import TrainConfig

COLOURS = {"ok": "green", "warn": "yellow", "FAIL": "red"}


def doctor(config: Annotated[Path, typer.Option("--config", "-c", help="YAML config (or a saved config.resolved.json)")],
           set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="dotted override key=value; repeatable")] = None,
           ) -> None:
    """Check what the run needs (GPUs, CUDA build, NCCL, model, data, critic, storage, ports) before it starts."""
    from deploy.config_loading import load_config
    from deploy.doctor import preflight

    checks = preflight(load_config(config, set_ or []))
    for check in checks:
        typer.secho(check.line(), fg=COLOURS[check.status])
    failed = sum(check.failed for check in checks)
    if failed:
        typer.secho(f"{failed} of {len(checks)} checks failed", fg="red", err=True)
        raise typer.Exit(1)


def require_preflight(cfg: TrainConfig) -> None:
    """`train`: the doctor's checks, before any actor starts; the failed ones as one UserError line."""
    from deploy.doctor import preflight

    checks = preflight(cfg)
    for check in checks:
        if check.status == "warn":
            typer.secho(check.line(), fg="yellow", err=True)
    failed = [check.line() for check in checks if check.failed]
    if failed:
        raise UserError("; ".join(failed) + " (`python -m deploy doctor` with the same --config and --set "
                        "lists every check)")
