"""Progress of a loop of steps on the console (training, SFT): a live bar on a terminal, a line
per step (or per `every` steps) anywhere else (a log file, `ray job submit`'s job log, CI), so that
a long run is never silent."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def step_summary(record: dict) -> str:
    """What one finished training step says: success, loss, response length, rollout time."""
    return (f"success {record.get('success_rate', 0):.2f}  loss {record.get('loss/total', 0):+.4f}  "
            f"len {record.get('response_len_mean', 0):.1f}  {record.get('time/rollout_s', 0):.0f}s rollout")


class StepProgress:
    """`with StepProgress(label, total, done, enabled=...) as p: ... p.advance(description)`;
    `completed(n)` after a rewind (a learner restart replays steps). Without a terminal a line is
    printed every `every` steps and at the last one."""

    def __init__(self, label: str, total: int, done: int = 0, *, enabled: bool = True, every: int = 1,
                 console: Console | None = None):
        self.label, self.total, self.done, self.enabled, self.every = label, total, done, enabled, max(1, every)
        self.console = console or Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self._bar: Progress | None = None
        self._task = None
        self._start = time.perf_counter()

    def __enter__(self) -> Self:
        if self.live:
            self._bar = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total, completed=self.done)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, err, tb)

    def advance(self, description: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=description)
        elif self.enabled and (self.done % self.every == 0 or self.done == self.total):
            elapsed = time.perf_counter() - self._start
            self.console.print(f"{self.label} {self.done}/{self.total}  {description}  ({elapsed:.0f}s)",
                               highlight=False, soft_wrap=True)

    def completed(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
