"""Parity tools of an environment (`EnvPlugin.parity()`, run by `python -m deploy env replay`): the
protocol they follow and their shared result (per-step mismatches and the closing count line).

A transcript tool (`record` / `replay`) records episodes on one backend and replays them on another,
comparing every step; a gold tool (`gold_replay`) replays the environment's own gold action
sequences through the project's wrapper and counts the wins. A tool may offer either or both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class TranscriptTool(Protocol):
    """Record and replay step transcripts (`deploy env replay --transcripts` / `--record`)."""

    ACCEPTS_ENV_KWARGS: bool
    """Whether `record` takes upstream options (`--env-kwargs`)."""

    def record(self, *, backend: str, data_path: Path, out: Path, episodes: int, seed: int,
               max_steps: int | None, **options: Any) -> int: ...

    def replay(self, *, backend: str, data_path: Path, transcripts: Path | None,
               env_meta: Path | None = None) -> ReplayReport: ...


@dataclass(frozen=True)
class GoldReplay:
    """`gold_replay`'s outcome: won of total tasks, and one line per task that was not won."""

    won: int
    total: int
    task_types: int
    failures: list[str] = field(default_factory=list)


GoldReplayFn = Callable[..., GoldReplay]


@dataclass(frozen=True)
class Mismatch:
    """One differing field of one replayed step."""

    episode: str  # game folder (ALFWorld) or goal_mode/session (WebShop)
    step: int  # 0 = the reset
    field: str
    expected: object
    got: object

    def line(self) -> str:
        return f"{self.episode}\tstep {self.step}\t{self.field}\texpected={self.expected!r}\tgot={self.got!r}"


@dataclass
class ReplayReport:
    """Replay outcome: a step is identical when none of its compared fields differ."""

    total_steps: int = 0
    identical_steps: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # reported separately (e.g. search-ranking differences)

    def lines(self) -> list[str]:
        return [m.line() for m in self.mismatches] + self.notes + [
            f"identical steps: {self.identical_steps}/{self.total_steps}"
        ]
