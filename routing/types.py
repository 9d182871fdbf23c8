"""Contracts of `routing` (stdlib + pydantic only): what a state tracker reads of an episode
(`TrackedEpisode`), the state signature it stamps on each turn and a matcher's per-turn decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class TrackedEpisode:
    """One recorded episode as a state tracker reads it (`routing.trackers`).

    `observations[0]` is the reset observation and `observations[t]` follows `actions[t-1]`; it
    holds one more entry than `actions` when the final observation is known. `admissible[t]` lists
    the actions shown with `observations[t]` (one per turn: the final observation's list is not
    recorded). `instruction` is the task's goal sentence."""

    task_id: str
    task_type: str
    instruction: str
    observations: Sequence[str]
    actions: Sequence[str]
    admissible: Sequence[Sequence[str]] = ()


class StateSignature(BaseModel):
    """Discrete, normalised state fields of one turn; hashable.

    `fields` is an ordered tuple of (name, value) pairs. `abstract()` drops ids so that
    signatures from different tasks can be compared.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str
    task_id: str
    fields: tuple[tuple[str, str], ...]

    def abstract(self) -> StateSignature:
        return StateSignature(env=self.env, task_id="*", fields=self.fields)


class RouteDecision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    matched: bool
    ref_position: int | None = None
    candidate_action: str | None = None
    reason: str = ""
