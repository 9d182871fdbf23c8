"""The training loop's progress on the console: a live bar on a terminal, one line per step
anywhere else (a log file, `ray job submit`'s job log, CI), so that a long run is never silent."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def step_summary(record: dict) -> str:
    """What one finished step says: success, loss, response length, rollout time."""
    return (f"success {record.get('success_rate', 0):.2f}  loss {record.get('loss/total', 0):+.4f}  "
            f"len {record.get('response_len_mean', 0):.1f}  {record.get('time/rollout_s', 0):.0f}s rollout")


class StepProgress:
    """`with StepProgress(total, done, enabled): ... progress.advance(record)`; `completed(n)` after a
    rewind (a learner restart replays steps)."""

    def __init__(self, total: int, done: int, *, enabled: bool, console: Console | None = None):
        self.total, self.done, self.enabled = total, done, enabled
        self.console = console or Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self._bar: Progress | None = None
        self._task = None
        self._start = time.perf_counter()

    def __enter__(self) -> Self:
        if self.live:
            self._bar = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total, completed=self.done)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, err, tb)

    def advance(self, record: dict) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=step_summary(record))
        elif self.enabled:
            elapsed = time.perf_counter() - self._start
            self.console.print(f"step {self.done}/{self.total}  {step_summary(record)}  ({elapsed:.0f}s)",
                               highlight=False, soft_wrap=True)

    def completed(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
