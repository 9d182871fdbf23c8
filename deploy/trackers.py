"""Experiment trackers behind `MetricsSink` (`run.loggers`): TensorBoard (RUN/tb/) and Weights &
Biases (optional: `pip install '.[wandb]'`). Each receives every step record and every evaluation;
W&B also gets the resolved config and one table per evaluation. metrics.jsonl and eval/*.json are
written by the sink whatever the trackers, so they stay the record of a run.

W&B honours its own environment variables: WANDB_MODE=offline writes RUN/wandb/offline-run-*/
without a server (sync later with `wandb sync`), WANDB_MODE=disabled turns it off. A resumed run
(`train --resume`) continues the same W&B run (its id is kept in RUN/wandb_run_id); steps the
resume replays are lower than W&B's last step, and W&B drops them with a warning."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from deploy.evaluation import EvalResult


class Tracker(Protocol):
    def log_scalars(self, values: Mapping[str, float], step: int) -> None: ...

    def log_eval(self, result: EvalResult, step: int) -> None: ...

    def close(self) -> None: ...


def eval_scalars(result: EvalResult) -> dict[str, float]:
    """eval/<split>/<metric> for one evaluation (score for WebShop only)."""
    base = f"eval/{result.split}"
    out = {f"{base}/avg_at_k": result.avg_at_k, f"{base}/pass_at_k": result.pass_at_k}
    if result.score is not None:
        out[f"{base}/score"] = result.score
    for key in ("response_len_mean", "rep4gram_ratio"):
        value = getattr(result, key)
        if value is not None:
            out[f"{base}/{key}"] = value
    return out


EVAL_TABLE_COLUMNS = ("label", "split", "task_type", "num_tasks", "avg_at_k", "pass_at_k", "score")


def eval_table_rows(result: EvalResult) -> list[list[Any]]:
    """One row per task type plus an `all` row, in EVAL_TABLE_COLUMNS order."""
    rows = [[result.label, result.split, ttype, r.num_tasks, r.avg_at_k, r.pass_at_k, r.score]
            for ttype, r in sorted(result.per_task_type.items())]
    rows.append([result.label, result.split, "all", result.num_tasks, result.avg_at_k, result.pass_at_k,
                 result.score])
    return rows


class TensorBoardTracker:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_eval(self, result: EvalResult, step: int) -> None:
        self.log_scalars(eval_scalars(result), step)

    def close(self) -> None:
        self._writer.close()


def import_wandb():
    """The wandb module, or an ImportError that says how to install it."""
    try:
        import wandb
    except ImportError:
        raise ImportError("run.loggers lists wandb but the wandb package is not installed: "
                          "pip install '.[wandb]' (or remove wandb from run.loggers)") from None
    return wandb


class WandbTracker:
    def __init__(self, run_dir: Path, *, project: str, name: str, config: dict[str, Any]):
        wandb = import_wandb()
        self._wandb = wandb
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        self._run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(run_dir),
                               config=config, reinit="create_new")

    def log_scalars(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def log_eval(self, result: EvalResult, step: int) -> None:
        table = self._wandb.Table(columns=list(EVAL_TABLE_COLUMNS), data=eval_table_rows(result))
        self._run.log({**eval_scalars(result), f"eval/{result.split}/table": table}, step=step)

    def close(self) -> None:
        self._run.finish()


def make_trackers(run_dir: Path, loggers: tuple[str, ...], *, config: dict[str, Any] | None) -> list[Tracker]:
    """The trackers `run.loggers` names, in order; `config` is the resolved config (W&B's run config)."""
    trackers: list[Tracker] = []
    for name in dict.fromkeys(loggers):
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir / "tb"))
        elif name == "wandb":
            run = (config or {}).get("run", {})
            trackers.append(WandbTracker(run_dir, project=run.get("wandb_project", "agentrl"),
                                         name=run.get("name", run_dir.name), config=config or {}))
        else:
            raise ValueError(f"run.loggers: unknown logger {name!r} (tensorboard, wandb)")
    return trackers
