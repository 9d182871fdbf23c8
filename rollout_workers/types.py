"""Contracts produced by `rollout_workers` (stdlib + pydantic only).

Token-in/token-out: `response_ids` are exactly the ids the engine sampled and `sampler_logprobs`
are the engine's log-probabilities of those ids under the distribution they were sampled from
(the constrained distribution when `allowed_token_ids` is set). Nothing downstream re-tokenises
decoded text.

Archived trajectories stay loadable: keys of fields these contracts no longer carry (a turn's
`signature` and `skill_ids`, a trajectory's `skill_bank_version`) are dropped when a JSON record is
validated; any other unknown key is still an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.types import EndReason, TaskSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _drop_retired(data: Any, keys: tuple[str, ...]) -> Any:
    """`data` without the retired `keys` (archived records may hold them; they are ignored)."""
    if isinstance(data, dict) and any(k in data for k in keys):
        return {k: v for k, v in data.items() if k not in keys}
    return data


class Turn(_Frozen):
    """One environment step = one training row.

    Invariants: len(sampler_logprobs) == len(response_ids); when `allowed_token_ids` is not None
    it has one entry per response id, each entry holding that id.
    `observation` is the environment's text BEFORE this turn's action (what the prompt showed);
    `next_observation` is the env's answer to the action.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    allowed_token_ids: tuple[tuple[int, ...], ...] | None = None
    response_text: str
    action: str | None = Field(description="parsed action inside the tags; None if unparseable")
    env_action: str = Field(default="", description="exactly what the env received (the prompt history shows it)")
    action_valid: bool
    invalid_reason: str | None = None
    observation: str
    admissible_actions: tuple[str, ...] = ()
    """The env's admissible commands the prompt listed (lets a teacher prompt be re-rendered)."""
    next_observation: str
    reward: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        return _drop_retired(data, ("signature", "skill_ids"))

    @model_validator(mode="after")
    def _aligned(self) -> Turn:
        if len(self.sampler_logprobs) != len(self.response_ids):
            raise ValueError(
                f"sampler_logprobs ({len(self.sampler_logprobs)}) must align 1:1 with "
                f"response_ids ({len(self.response_ids)})"
            )
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) != len(self.response_ids):
            raise ValueError("allowed_token_ids must have one entry per response id")
        return self


class Trajectory(_Frozen):
    """One episode. `group_id` is shared by the G rollouts of one task (same seed)."""

    task: TaskSpec
    group_id: str
    traj_id: str
    turns: tuple[Turn, ...]
    success: bool
    score: float = Field(description="episode reward (ALFWorld: reward_scale x won)")
    task_score: float | None = Field(
        default=None,
        description="the env's raw task score at the episode's last step (WebShop: the purchase score "
        "in [0, 1], 0 without a purchase); None when the env reports none (ALFWorld)",
    )
    policy_version: int
    skill_text: str | None = Field(default=None, description="UniSkill: the skill shown in every prompt of this episode")
    end_reason: EndReason
    end_detail: str | None = Field(
        default=None,
        description="why an infrastructure failure happened (the env's error, the prompt length); None otherwise",
    )

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        return _drop_retired(data, ("skill_bank_version",))

    @property
    def infrastructure_failure(self) -> bool:
        """The episode ended because of the system, not the policy (`INFRASTRUCTURE_FAILURES`)."""
        return self.end_reason in INFRASTRUCTURE_FAILURES


INFRASTRUCTURE_FAILURES: frozenset[EndReason] = frozenset({"env_error", "prompt_too_long"})
"""End reasons that say nothing about the policy: the env crashed, or the next prompt could not be
shown. Such episodes are never trained on as failures (`split_infrastructure_failures`)."""


def split_infrastructure_failures(
    trajectories: Sequence[Trajectory],
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(episodes to learn from, infrastructure failures): the one rule GRPO groups, SMRC-SD
    references and UniSkill candidates share. A group that loses members keeps the rest (its
    statistics are over the episodes the policy really played)."""
    kept = [t for t in trajectories if not t.infrastructure_failure]
    return kept, [t for t in trajectories if t.infrastructure_failure]


class Generation(_Frozen):
    """One engine completion. `allowed_token_ids` is set only for constrained decoding."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: Literal["stop", "length", "abort"]
    allowed_token_ids: tuple[tuple[int, ...], ...] | None = None


class RolloutStats(_Frozen):
    num_episodes: int
    num_turns: int
    num_generated_tokens: int
    num_prompt_tokens: int
    generate_s: float
    env_s: float
    total_s: float


class Candidate(_Frozen):
    """One UniSkill proposer input chosen from a rollout group (docs/algorithms.md S3): four DISTINCT
    trajectories of the same task and retrieved skill. The source and the opposite-outcome
    reference go into the proposer prompt; the held-out success / failure anchors (never shown to
    the proposer) are the ones R_align scores (S4)."""

    candidate_id: str
    group_id: str
    task_id: str
    source_id: str
    reference_id: str
    """Opposite outcome to the source."""
    plus_id: str
    """Held-out success anchor tau+."""
    minus_id: str
    """Held-out failure anchor tau-."""
    source_won: bool

    @model_validator(mode="after")
    def _distinct(self) -> Candidate:
        ids = (self.source_id, self.reference_id, self.plus_id, self.minus_id)
        if len(set(ids)) != 4:
            raise ValueError(
                f"candidate {self.candidate_id}: the four trajectories must be distinct, got {ids}"
            )
        return self
