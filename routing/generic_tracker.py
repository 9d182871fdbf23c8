"""The generic state tracker, for an environment that gives SMRC-SD none (`EnvPlugin.tracker()`
returns None): it works from the observation text alone.

- Signature of observation t: one field, `observation`, the first 16 hex digits of the SHA-1 of
  the observation normalised as the matchers normalise text (`routing.matching.normalize_text`:
  lowercased, whitespace runs collapsed). Two turns share a signature exactly when their
  normalised observations are equal, so the structured matcher on these signatures would be the
  observation matcher under another name; the matchers meant for it are "history" (the paper's
  action-prefix matcher, which needs no state at all) and "observation".
- State summary at turn t: the number of steps taken and the last action (no state fields).
- Held instances: none.

What it cannot see: anything the observation does not print (inventory, the state of objects out
of view, options chosen on an earlier page), so two different states that read the same are one
state, and one state that reads differently (a step counter, a timestamp, random flavour text in
the observation) is many; it has no abstract (cross-task) signature beyond the digest, and no
instance binding. `method.matcher: structured` therefore needs an environment's own tracker and
is refused for an environment without one (`deploy.config`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from routing.matching import normalize_text
from routing.types import StateSignature, TrackedEpisode

MATCHERS_WITHOUT_TRACKER = ("history", "observation")
"""`method.matcher` values that work on the generic tracker."""


def observation_digest(observation: str) -> str:
    """16 hex digits identifying the normalised observation."""
    return hashlib.sha1(normalize_text(observation).encode("utf-8")).hexdigest()[:16]


class GenericTracker:
    """Signatures from normalised observation digests (see the module docstring)."""

    def __init__(self, env: str) -> None:
        self.env = env

    def signatures(self, episode: TrackedEpisode) -> list[StateSignature]:
        return [StateSignature(env=self.env, task_id=episode.task_id, fields=(("observation", observation_digest(o)),))
                for o in episode.observations]

    def state_summary(self, episode: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
        last = episode.actions[t - 1] if 0 < t <= len(episode.actions) else "none"
        return {"steps_taken": str(t), "last_action": last}

    def held(self, episode: TrackedEpisode) -> list[str | None]:
        return []
