"""Episodes split for the data path (docs/architecture.md "Who holds which bytes"): a rollout
worker hands the driver each episode's summary (`TrajectorySummary`: ids, scores, end reason, the
turns' text and token counts) and leaves the token arrays in the object store as one `TokenPack`
per call, which only the learners fetch and `join` back into whole trajectories.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envs.health import repeated_ngram_ratio
from rollout_workers.types import AnyTrajectory, TokenPack, Trajectory, TrajectorySummary, Turn, TurnSummary

_TURN_TOKENS = ("prompt_ids", "response_ids", "sampler_logprobs", "allowed_token_ids")
_TURN_COUNTS = ("num_prompt_tokens", "num_response_tokens", "rep4gram_ratio")


def rep4gram_ratio(turn: Turn | TurnSummary) -> float:
    """The turn's repeated 4-gram ratio: measured from its response ids (a whole turn), or by the
    rollout worker that summarised it."""
    return turn.rep4gram_ratio if isinstance(turn, TurnSummary) else repeated_ngram_ratio(turn.response_ids)


def turn_summary(turn: Turn) -> TurnSummary:
    text = {k: v for k, v in turn.__dict__.items() if k not in _TURN_TOKENS}
    return TurnSummary.model_construct(
        turn.__pydantic_fields_set__ - set(_TURN_TOKENS), **text, num_prompt_tokens=turn.num_prompt_tokens,
        num_response_tokens=turn.num_response_tokens, rep4gram_ratio=repeated_ngram_ratio(turn.response_ids))


def summary(traj: Trajectory) -> TrajectorySummary:
    """The episode without its token arrays."""
    fields = {k: v for k, v in traj.__dict__.items() if k != "turns"}
    return TrajectorySummary.model_construct(traj.__pydantic_fields_set__, **fields,
                                             turns=tuple(turn_summary(t) for t in traj.turns))


def summarize(trajectories: Sequence[Trajectory]) -> tuple[list[TrajectorySummary], TokenPack]:
    """The trajectories split into what the driver reads (their summaries) and what only the learners
    read (their token arrays); `join` puts them back together."""
    return [summary(t) for t in trajectories], TokenPack.of(trajectories)


def join(summaries: Sequence[TrajectorySummary], packs: Sequence[TokenPack]) -> list[Trajectory]:
    """The whole trajectories of `summaries` (in their order) from the packs holding their arrays;
    equal to the trajectories `summarize` split. Raises ValueError naming an episode no pack holds."""
    tokens: dict[str, list[dict[str, Any]]] = {}
    for pack in packs:
        tokens.update(pack.by_trajectory())
    out = []
    for s in summaries:
        if s.traj_id not in tokens:
            raise ValueError(f"no token pack holds the arrays of episode {s.traj_id}")
        turns = tuple(
            Turn.model_construct((turn.__pydantic_fields_set__ - set(_TURN_COUNTS)) | set(_TURN_TOKENS[:3]),
                                 **{k: v for k, v in turn.__dict__.items() if k not in _TURN_COUNTS}, **arrays)
            for turn, arrays in zip(s.turns, tokens[s.traj_id], strict=True))
        fields = {k: v for k, v in s.__dict__.items() if k != "turns"}
        out.append(Trajectory.model_construct(s.__pydantic_fields_set__, **fields, turns=turns))
    return out


def trajectory_from_json(line: str) -> AnyTrajectory:
    """A JSON record of either form: whole (its turns hold token arrays) or a summary."""
    data = json.loads(line)
    turns = data.get("turns") if isinstance(data, dict) else None
    whole = not isinstance(turns, list) or any(isinstance(t, dict) and "prompt_ids" in t for t in turns)
    return (Trajectory if whole else TrajectorySummary).model_validate(data)
