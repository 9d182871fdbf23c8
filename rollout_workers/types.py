"""Contracts produced by `rollout_workers` (stdlib, pydantic and numpy only).

Token ids and log-probs are contiguous, read-only numpy arrays (`TokenIds` int32, `LogProbs`
float64). They read like the tuples they replaced wherever code reads them (len, indexing,
iteration yields Python numbers, == with a tuple or list, hashing) and travel as arrays: a pickle
holds the raw buffer (Ray ships it out of band and maps it without a copy on the same node), where
a tuple costs a pickle opcode and a 28-byte object per token. As JSON they are lists of numbers, as
before, so trajectories archived before the arrays load unchanged.

Token-in/token-out: `response_ids` are exactly the ids the engine sampled and `sampler_logprobs`
are the engine's log-probabilities of those ids under the distribution they were sampled from
(the constrained distribution when `allowed_token_ids` is set). Nothing downstream re-tokenises
decoded text.

A run's driver never holds the arrays: a rollout worker hands it each episode as a
`TrajectorySummary` (the turns' text and token counts) and leaves the arrays in the object store as
a `TokenPack`, which the learners join back into `Trajectory`s (`rollout_workers.summaries`).

Archived trajectories stay loadable: keys of fields these contracts no longer carry (a turn's
`signature` and `skill_ids`, a trajectory's `skill_bank_version`) are dropped when a JSON record is
validated; any other unknown key is still an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, model_validator

from envs.types import EndReason, TaskSpec


class _Array(Sequence):
    """A flat, read-only numpy array of `dtype` that reads like a tuple (see the module docstring)."""

    __slots__ = ("_a",)
    dtype: ClassVar[type]

    def __init__(self, values: Any = ()) -> None:
        if isinstance(values, _Array):
            values = values._a
        try:
            a = np.asarray(values, dtype=self.dtype)
        except (TypeError, ValueError, OverflowError) as err:  # a null or a word among the ids: bad data
            raise ValueError(f"{type(self).__name__} needs numbers ({np.dtype(self.dtype).name}): {err}") from None
        if a.ndim != 1:
            raise ValueError(f"{type(self).__name__} needs a flat sequence, got shape {a.shape}")
        if a.flags.writeable:
            if a is values:  # never freeze the caller's own array
                a = a.copy()
            a.setflags(write=False)
        self._a = a

    @property
    def array(self) -> np.ndarray:
        """The read-only numpy array (no copy)."""
        return self._a

    def tolist(self) -> list:
        return self._a.tolist()

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return type(self)(self._a[i])
        return self._a[i].item()

    def __iter__(self) -> Iterator:
        return iter(self._a.tolist())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self._a if dtype is None else self._a.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Array):
            return self._a.shape == other._a.shape and bool(np.array_equal(self._a, other._a))
        if isinstance(other, (tuple, list)):
            return self._a.tolist() == list(other)
        if isinstance(other, np.ndarray):
            return self._a.shape == other.shape and bool(np.array_equal(self._a, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._a.tolist()))  # equal to an equal tuple's hash, as == promises

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._a.tolist()!r})"

    def __reduce__(self):
        return type(self), (self._a,)

    @classmethod
    def _validate(cls, value: Any) -> _Array:
        if isinstance(value, cls):
            return value
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            raise ValueError(f"expected a sequence of numbers, got {type(value).__name__}")  # noqa: TRY004 - pydantic reports ValueError
        return cls(value)


class TokenIds(_Array):
    """Token ids (int32)."""

    __slots__ = ()
    dtype = np.int32


class LogProbs(_Array):
    """Log-probabilities (float64: the engines' values exactly)."""

    __slots__ = ()
    dtype = np.float64


def _as_list(value: _Array) -> list:
    return value.tolist()


TokenIdArray = Annotated[TokenIds, PlainValidator(TokenIds._validate), PlainSerializer(_as_list, when_used="json")]
"""A contract field holding token ids (validated from any flat sequence; JSON: a list)."""
LogProbArray = Annotated[LogProbs, PlainValidator(LogProbs._validate), PlainSerializer(_as_list, when_used="json")]
"""A contract field holding log-probs (validated from any flat sequence; JSON: a list)."""


def as_token_ids(values: Sequence[int] | np.ndarray) -> TokenIds:
    return TokenIds._validate(values)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _drop_retired(data: Any, keys: tuple[str, ...]) -> Any:
    """`data` without the retired `keys` (archived records may hold them; they are ignored)."""
    if isinstance(data, dict) and any(k in data for k in keys):
        return {k: v for k, v in data.items() if k not in keys}
    return data


class _TurnText(_Frozen):
    """What a turn holds besides its token arrays (`Turn`, `TurnSummary`)."""

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


class Turn(_TurnText):
    """One environment step = one training row.

    Invariants: len(sampler_logprobs) == len(response_ids); when `allowed_token_ids` is not None
    it has one entry per response id, each entry holding that id.
    `observation` is the environment's text BEFORE this turn's action (what the prompt showed);
    `next_observation` is the env's answer to the action.
    """

    prompt_ids: TokenIdArray
    response_ids: TokenIdArray
    sampler_logprobs: LogProbArray
    allowed_token_ids: tuple[tuple[int, ...], ...] | None = None

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

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)


class TurnSummary(_TurnText):
    """A turn without its token arrays (what the driver decides on: docs/architecture.md "Who holds
    which bytes"); its token counts and repeated 4-gram ratio are measured by the rollout worker."""

    num_prompt_tokens: int
    num_response_tokens: int
    rep4gram_ratio: float


class _EpisodeFields(_Frozen):
    """What an episode holds besides its turns (`Trajectory`, `TrajectorySummary`)."""

    task: TaskSpec
    group_id: str
    traj_id: str
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


class Trajectory(_EpisodeFields):
    """One episode. `group_id` is shared by the G rollouts of one task (same seed)."""

    turns: tuple[Turn, ...]

    def __reduce__(self):
        """Pickled with the token arrays of all its turns packed into three contiguous buffers (Ray
        ships each buffer out of band, and a buffer costs about as much to map as to copy a turn's
        ids): unpickling slices them into the turns' arrays without a copy and without validation."""
        turn_fields = [({k: v for k, v in t.__dict__.items() if k not in _TURN_ARRAYS}, t.__pydantic_fields_set__)
                       for t in self.turns]
        fields = {k: v for k, v in self.__dict__.items() if k != "turns"}
        return _unpack_trajectory, (fields, self.__pydantic_fields_set__, turn_fields, *_packed(self.turns))


class TrajectorySummary(_EpisodeFields):
    """An episode without its turns' token arrays: what the rollout workers hand the driver (ids,
    group, score, end reason, the turns' text for routing, token counts for metrics), while the
    arrays stay in the object store as a `TokenPack` that only the learners fetch
    (`rollout_workers.summaries.join`)."""

    turns: tuple[TurnSummary, ...]


AnyTrajectory = Trajectory | TrajectorySummary
"""An episode as the driver's stages read it: its summary (a run's), or whole (tools, tests); both
hold the ids, scores, end reason, turns' text and token counts."""

_TURN_ARRAYS = ("prompt_ids", "response_ids", "sampler_logprobs")


def _packed(turns: Sequence[Turn]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lengths: (turns, 2) prompt and response tokens, prompts, responses, logprobs): the turns'
    arrays, each concatenated in turn order."""
    arrays = [np.concatenate([getattr(t, name).array for t in turns]) if turns else np.zeros(0, dtype)
              for name, dtype in zip(_TURN_ARRAYS, (np.int32, np.int32, np.float64))]
    lengths = np.array([[len(t.prompt_ids), len(t.response_ids)] for t in turns], dtype=np.int64).reshape(-1, 2)
    return lengths, *arrays


def _sliced(lengths: np.ndarray, prompts: np.ndarray, responses: np.ndarray,
            logprobs: np.ndarray) -> Iterator[dict[str, _Array]]:
    """`_packed`'s inverse: per turn, its arrays as read-only views of the buffers (no copy)."""
    for a in (prompts, responses, logprobs):
        if a.flags.writeable:
            a.setflags(write=False)
    p_end, r_end = np.cumsum(lengths[:, 0]).tolist(), np.cumsum(lengths[:, 1]).tolist()
    p0 = r0 = 0
    for p1, r1 in zip(p_end, r_end):
        yield {"prompt_ids": TokenIds(prompts[p0:p1]), "response_ids": TokenIds(responses[r0:r1]),
               "sampler_logprobs": LogProbs(logprobs[r0:r1])}
        p0, r0 = p1, r1


def _unpack_trajectory(fields: dict, fields_set: set, turn_fields: list, lengths: np.ndarray, prompts: np.ndarray,
                       responses: np.ndarray, logprobs: np.ndarray) -> Trajectory:
    """`Trajectory.__reduce__`'s inverse: the turns' arrays are read-only views of the packed buffers."""
    turns = [Turn.model_construct(turn_set, **values, **arrays)
             for (values, turn_set), arrays in zip(turn_fields, _sliced(lengths, prompts, responses, logprobs),
                                                   strict=True)]
    return Trajectory.model_construct(fields_set, **fields, turns=tuple(turns))


@dataclass(frozen=True)
class TokenPack:
    """The token arrays of some trajectories' turns (a collect call's), packed into three contiguous
    buffers in turn order (Ray ships them out of band), with the constrained-decoding masks."""

    traj_ids: tuple[str, ...]
    turn_counts: tuple[int, ...]
    lengths: np.ndarray
    prompts: np.ndarray
    responses: np.ndarray
    logprobs: np.ndarray
    allowed: tuple[tuple[tuple[int, ...], ...] | None, ...]
    """Per turn: its `allowed_token_ids` (None: unconstrained)."""

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> TokenPack:
        turns = [turn for t in trajectories for turn in t.turns]
        return cls(tuple(t.traj_id for t in trajectories), tuple(len(t.turns) for t in trajectories),
                   *_packed(turns), tuple(turn.allowed_token_ids for turn in turns))

    def by_trajectory(self) -> dict[str, list[dict[str, Any]]]:
        """traj_id -> its turns' token fields (views of the buffers)."""
        turns = iter(dict(arrays, allowed_token_ids=allowed) for arrays, allowed in
                     zip(_sliced(self.lengths, self.prompts, self.responses, self.logprobs), self.allowed, strict=True))
        return {tid: [next(turns) for _ in range(n)] for tid, n in zip(self.traj_ids, self.turn_counts, strict=True)}


_E = TypeVar("_E", Trajectory, TrajectorySummary)

INFRASTRUCTURE_FAILURES: frozenset[EndReason] = frozenset({"env_error", "prompt_too_long"})
"""End reasons that say nothing about the policy: the env crashed, or the next prompt could not be
shown. Such episodes are never trained on as failures (`split_infrastructure_failures`)."""


def split_infrastructure_failures(trajectories: Sequence[_E]) -> tuple[list[_E], list[_E]]:
    """(episodes to learn from, infrastructure failures): the one rule GRPO groups, SMRC-SD
    references and UniSkill candidates share. A group that loses members keeps the rest (its
    statistics are over the episodes the policy really played)."""
    kept = [t for t in trajectories if not t.infrastructure_failure]
    return kept, [t for t in trajectories if t.infrastructure_failure]


class Generation(_Frozen):
    """One engine completion. `allowed_token_ids` is set only for constrained decoding."""

    token_ids: TokenIdArray
    logprobs: LogProbArray
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
