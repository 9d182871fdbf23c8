"""Typed contracts shared by the testbed data builders (teacher, skill, proposer turns) and the ability figures."""

from __future__ import annotations

from dataclasses import dataclass

TURN_KINDS = (
    "plain",
    "teacher_matched",
    "teacher_unmatched",
    "teacher_followed",
    "skill_helpful",
    "skill_irrelevant",
    "proposer",
)


@dataclass(frozen=True)
class SFTTurn:
    """One supervised example in the training chat format: the exact prompt ids the system renders
    and the target ids (the assistant's reply, ending with the end-of-turn token as plain SFT does)."""

    prompt_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    kind: str  # one of TURN_KINDS

    def __post_init__(self) -> None:
        if self.kind not in TURN_KINDS:
            raise ValueError(f"SFTTurn.kind={self.kind!r} is not one of {TURN_KINDS}")
        if not self.target_ids:
            raise ValueError("SFTTurn.target_ids is empty: every SFT example needs at least one target token")


@dataclass(frozen=True)
class AbilityFigure:
    """A measured in-context ability: the mean over held-out items with its 95% bootstrap CI."""

    mean: float
    lo: float
    hi: float
    n: int
    per_item: tuple[float, ...]
    samples: tuple[str, ...] = ()
    """What was scored, where it is text (the proposer's sampled outputs), to read why items failed."""
