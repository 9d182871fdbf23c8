"""Per-env state tracking for routing, read from each environment's plugin (`envs.api.EnvPlugin`,
resolved by name through `envs.registry`): the tracker profile that stamps a recorded episode's
turns with state signatures, summarises the state for the teacher and names the held instances.

An environment that provides a tracker (`plugin.tracker()`, e.g. the built-in ALFWorld and WebShop
trackers in `envs.alfworld.tracker` and `envs.webshop.tracker`) is routed with it; one that
provides none gets the generic observation-text tracker (`routing.generic_tracker`), on which
only the matchers in `MATCHERS_WITHOUT_TRACKER` are meaningful.

`held(episode)` gives the object instance held at each observation where the signature names it
by class only, so a matched reference's actions can be bound to the student's instance
(`routing.matching.binding`); an env without instances returns [].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs.registry import get_plugin
from routing.generic_tracker import MATCHERS_WITHOUT_TRACKER, GenericTracker
from routing.types import StateSignature, TrackedEpisode

__all__ = ["MATCHERS_WITHOUT_TRACKER", "TrackerProfile", "has_tracker", "tracker_profile"]

SignaturesFn = Callable[[TrackedEpisode], list[StateSignature]]
StateSummaryFn = Callable[[TrackedEpisode, int, Sequence[StateSignature]], dict[str, str]]
HeldFn = Callable[[TrackedEpisode], list[str | None]]


@dataclass(frozen=True)
class TrackerProfile:
    """How routing tracks one env's state: `signatures(episode)` gives one exact signature per
    observation; `state_summary(episode, t, signatures)` the fields the teacher's state summary
    shows at turn t (`routing.teacher_context`); `held(episode)` the instance held at each
    observation ([] for an env without instances). `generic`: the env has no tracker of its own."""

    env: str
    signatures: SignaturesFn
    state_summary: StateSummaryFn
    held: HeldFn
    generic: bool = False


def has_tracker(env: str) -> bool:
    """Whether the env provides its own state tracker (else routing uses the generic one)."""
    return get_plugin(env).tracker() is not None


@functools.cache
def tracker_profile(env: str) -> TrackerProfile:
    """The env's tracker profile (the generic one when it provides none); a ValueError naming the
    registered envs for an unknown name."""
    own = get_plugin(env).tracker()
    tracker = own if own is not None else GenericTracker(env)
    return TrackerProfile(env, tracker.signatures, tracker.state_summary, tracker.held, generic=own is None)
