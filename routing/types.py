"""Contracts of `routing` (stdlib + pydantic only): a matcher's per-turn decision, and (from
`envs.types`, where environments' trackers find them) what a state tracker reads of an episode
(`TrackedEpisode`) and the state signature it stamps on each turn."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from envs.types import StateSignature, TrackedEpisode

__all__ = ["RouteDecision", "StateSignature", "TrackedEpisode"]


class RouteDecision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    matched: bool
    ref_position: int | None = None
    candidate_action: str | None = None
    reason: str = ""
