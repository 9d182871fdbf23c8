"""Per-env state tracking for routing, in one table: env name -> the tracker profile that stamps
a recorded episode's turns with state signatures and summarises the state for the teacher.

- ALFWorld (`routing.alfworld_tracker`): signatures from the observation stream; the state
  summary is the exact signature's fields.
- WebShop (`routing.webshop_tracker`): signatures from the observations, the actions and the
  admissible actions shown on each page (they tell option values from headers); the exact
  signature holds no stage, so the summary is the tracker's progress fields instead.

`held(episode)` gives the object instance held at each observation where the signature names it
by class only (ALFWorld), so a matched reference's actions can be bound to the student's instance
(`routing.matching.binding`); WebShop has no instances and returns [].

A new environment adds its tracker module and one entry to `TRACKERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from routing import alfworld_tracker, webshop_tracker
from routing.types import StateSignature, TrackedEpisode

SignaturesFn = Callable[[TrackedEpisode], list[StateSignature]]
StateSummaryFn = Callable[[TrackedEpisode, int, Sequence[StateSignature]], dict[str, str]]
HeldFn = Callable[[TrackedEpisode], list[str | None]]


@dataclass(frozen=True)
class TrackerProfile:
    """How routing tracks one env's state: `signatures(episode)` gives one exact signature per
    observation; `state_summary(episode, t, signatures)` the fields the teacher's state summary
    shows at turn t (`routing.teacher_context`); `held(episode)` the instance held at each
    observation ([] for an env without instances)."""

    env: str
    signatures: SignaturesFn
    state_summary: StateSummaryFn
    held: HeldFn


def _alfworld_signatures(ep: TrackedEpisode) -> list[StateSignature]:
    return alfworld_tracker.signatures_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations,
                                                   ep.actions)


def _alfworld_held(ep: TrackedEpisode) -> list[str | None]:
    return alfworld_tracker.held_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations, ep.actions)


def _no_instances(ep: TrackedEpisode) -> list[str | None]:
    return []


def _signature_fields(ep: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
    return dict(signatures[t].fields)


def _webshop_signatures(ep: TrackedEpisode) -> list[StateSignature]:
    return webshop_tracker.signatures_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations,
                                                  ep.actions, admissible=ep.admissible)


WEBSHOP_SUMMARY_FIELDS = ("stage", "page", "product", "options", "option_progress", "price_ok")


def _webshop_summary(ep: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
    """The tracker's progress fields after observation t (replayed from the reset)."""
    tracker = webshop_tracker.WebShopTracker(ep.task_id, ep.instruction)
    for k in range(t + 1):
        shown = ep.admissible[k] if k < len(ep.admissible) else None
        tracker.observe(None if k == 0 else ep.actions[k - 1], ep.observations[k], shown)
    return {key: value for key, value in tracker.fields().items() if key in WEBSHOP_SUMMARY_FIELDS}


TRACKERS: dict[str, TrackerProfile] = {
    alfworld_tracker.ENV_NAME: TrackerProfile(alfworld_tracker.ENV_NAME, _alfworld_signatures, _signature_fields,
                                              _alfworld_held),
    webshop_tracker.ENV_NAME: TrackerProfile(webshop_tracker.ENV_NAME, _webshop_signatures, _webshop_summary,
                                             _no_instances),
}


def tracker_profile(env: str) -> TrackerProfile:
    """The env's tracker profile; a ValueError naming the known envs for any other name."""
    try:
        return TRACKERS[env]
    except KeyError:
        raise ValueError(f"no state tracker for env {env!r}; known envs: {', '.join(sorted(TRACKERS))}") from None
