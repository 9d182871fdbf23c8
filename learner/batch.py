"""From trajectories to training rows to padded token tensors. Token-in/token-out: the ids the
engine sampled are used as they are; nothing is decoded or re-tokenised here.

`learner` may not import `rollout_workers`, so trajectories are accepted structurally: anything
with the attributes of `TrajectoryLike` / `TurnLike` (`rollout_workers.types.Trajectory` has them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from learner.gigpo import anchor_key, discounted_returns
from learner.types import TokenBatch, TrainRow


class TurnLike(Protocol):
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def response_ids(self) -> Sequence[int]: ...
    @property
    def sampler_logprobs(self) -> Sequence[float]: ...
    @property
    def allowed_token_ids(self) -> Sequence[Sequence[int]] | None: ...
    @property
    def action_valid(self) -> bool: ...
    # optional (GiGPO; `rollout_workers.types.Turn` has them): observation: str, reward: float


class TrajectoryLike(Protocol):
    @property
    def group_id(self) -> str: ...
    @property
    def traj_id(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def turns(self) -> Sequence[TurnLike]: ...
    # optional (`rollout_workers.types.Trajectory` has it): policy_version: int, copied onto every row


class TurnCounts(Protocol):
    """A turn without its token arrays (`rollout_workers.types.TurnSummary` has these): enough for a
    blank row."""

    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_response_tokens(self) -> int: ...
    @property
    def action_valid(self) -> bool: ...


def rows_from_trajectories(
    trajectories: Iterable[TrajectoryLike],
    teacher_prompts: Mapping[tuple[str, int], Sequence[int]] | None = None,
    *,
    gamma: float = 1.0,
) -> list[TrainRow]:
    """One row per turn (verl-agent): every row of a trajectory carries the episode score.
    Every row carries its trajectory's `policy_version` (the engine's weights when it sampled;
    None when the trajectory has none). For GiGPO each row also carries its anchor key (a digest
    of the observation the turn acted on) and its discounted return with discount `gamma`
    (`learner.gigpo`), both over all env steps.

    Turns without response tokens (nothing was generated) cannot be trained on and are dropped.
    `teacher_prompts` (SMRC-SD routing) maps (traj_id, turn index in `traj.turns`) to the
    teacher-context prompt ids of that turn; it becomes `TrainRow.teacher_prompt_ids` (turns
    without an entry get None = no distillation).

    A trajectory whose turns carry token counts instead of token arrays (`TurnCounts`: an episode
    summary) gives blank rows (`blank_row`), in the same places: a learner rank that trains
    other ranks' episodes' rows by their lengths alone (`learner.sharding.episode_owners`).
    """
    teacher_prompts = teacher_prompts or {}
    rows = []
    for traj in trajectories:
        version = getattr(traj, "policy_version", None)
        returns = discounted_returns([float(getattr(t, "reward", 0.0)) for t in traj.turns], gamma)
        for step_idx, turn in enumerate(traj.turns):
            blank = not hasattr(turn, "response_ids")
            if not (turn.num_response_tokens if blank else turn.response_ids):
                continue
            teacher = teacher_prompts.get((traj.traj_id, step_idx))
            fields = {
                "group_id": traj.group_id,
                "traj_id": traj.traj_id,
                "step_idx": step_idx,
                "episode_score": float(traj.score),
                "action_valid": bool(turn.action_valid),
                "teacher_prompt_ids": teacher if blank or teacher is None else _ids(teacher),
                "anchor_key": _anchor(turn),
                "step_return": returns[step_idx],
                "policy_version": None if version is None else int(version),
            }
            if blank:
                rows.append(blank_row(turn, **fields))
                continue
            allowed = turn.allowed_token_ids
            rows.append(
                TrainRow(
                    prompt_ids=tuple(turn.prompt_ids),
                    response_ids=tuple(turn.response_ids),
                    sampler_logprobs=tuple(turn.sampler_logprobs),
                    allowed_token_ids=None if allowed is None else tuple(tuple(a) for a in allowed),
                    **fields,
                )
            )
    return rows


def blank_ids(length: int) -> np.ndarray:
    """`length` zero ids as a read-only view of one zero (no memory per token)."""
    return np.broadcast_to(np.int32(0), (length,))


def blank_row(turn: TurnCounts, **fields: object) -> TrainRow:
    """A row of `turn`'s lengths whose token ids and sampler log-probs are zeros (`blank_ids`), with
    `fields` as given (its teacher prompt, when it has one, as given too): what a learner rank
    reads of a row another rank trains (lengths, scores, keys), never forwarded for its values
    (docs/algorithms.md S7.9). Built without validation, as its zeros need none."""
    return TrainRow.model_construct(
        prompt_ids=blank_ids(turn.num_prompt_tokens), response_ids=blank_ids(turn.num_response_tokens),
        sampler_logprobs=np.broadcast_to(np.float32(0.0), (turn.num_response_tokens,)), **fields,
    )  # fmt: skip


def _anchor(turn: TurnLike) -> str:
    """The turn's GiGPO anchor key; "" (an anchor group of its own) for a turn without an observation."""
    observation = getattr(turn, "observation", None)
    return "" if observation is None else anchor_key(observation)


def _ids(prompt: Sequence[int]) -> tuple[int, ...]:
    return tuple(prompt.tolist()) if hasattr(prompt, "tolist") else tuple(int(t) for t in prompt)  # arrays: one C call


def teacher_rows(rows: Sequence[TrainRow]) -> list[TrainRow]:
    """The teacher-context copies of the rows that have `teacher_prompt_ids`, in order: the same
    row with `prompt_ids` replaced by the teacher prompt (response ids, sampler log-probs and
    `allowed_token_ids` unchanged), so `collate_rows` of them scores the IDENTICAL responses
    under the teacher context (docs/algorithms.md d)."""
    return [
        r.model_copy(update={"prompt_ids": r.teacher_prompt_ids, "teacher_prompt_ids": None})
        for r in rows
        if r.teacher_prompt_ids is not None
    ]


def _dense_index(keys: Sequence[object]) -> torch.Tensor:
    """Dense ids in order of first appearance: ["b", "a", "b"] -> [0, 1, 0]."""
    ids: dict[object, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def _allowed_tensor(rows: Sequence[TrainRow], response_len: int) -> torch.Tensor | None:
    if all(r.allowed_token_ids is None for r in rows):
        return None
    width = max(len(a) for r in rows if r.allowed_token_ids is not None for a in r.allowed_token_ids)
    allowed = torch.full((len(rows), response_len, width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        for t, ids in enumerate(row.allowed_token_ids or ()):
            allowed[i, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return allowed


def collate_rows(rows: Sequence[TrainRow], *, pad_token_id: int) -> TokenBatch:
    """Left-pad prompts to the longest prompt, right-pad responses to the longest response."""
    if not rows:
        raise ValueError("collate_rows needs at least one row")
    n = len(rows)
    prompt_len = max(len(r.prompt_ids) for r in rows)
    response_len = max(len(r.response_ids) for r in rows)
    input_ids = torch.full((n, prompt_len + response_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    sampler_logp = torch.zeros(n, response_len)
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        input_ids[i, prompt_len - p : prompt_len] = torch.tensor(row.prompt_ids)
        input_ids[i, prompt_len : prompt_len + r] = torch.tensor(row.response_ids)
        attention_mask[i, prompt_len - p : prompt_len + r] = 1
        sampler_logp[i, :r] = torch.tensor(row.sampler_logprobs)
    traj_keys = [(r.group_id, r.traj_id) for r in rows]
    traj_index = _dense_index(traj_keys)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp_min(0),
        responses=input_ids[:, prompt_len:].clone(),
        response_mask=attention_mask[:, prompt_len:].float(),
        sampler_logp=sampler_logp,
        allowed_ids=_allowed_tensor(rows, response_len),
        episode_scores=torch.tensor([r.episode_score for r in rows], dtype=torch.float32),
        action_valid=torch.tensor([r.action_valid for r in rows], dtype=torch.bool),
        group_index=_dense_index([r.group_id for r in rows]),
        traj_index=traj_index,
        traj_num_rows=torch.bincount(traj_index)[traj_index],
        row_index=torch.arange(n),
        policy_version=torch.tensor([-1 if r.policy_version is None else r.policy_version for r in rows]),
        anchor_index=_dense_index([(r.group_id, r.anchor_key or (r.traj_id, r.step_idx)) for r in rows]),
        step_returns=torch.tensor([r.step_return for r in rows], dtype=torch.float32),
    )


def select_rows(batch: TokenBatch, index: torch.Tensor) -> TokenBatch:
    """Rows `index` (int64 (b,)) of `batch`, with columns that are padding in every selected row
    trimmed (leading prompt pads, trailing response pads). Row-level fields keep their values, so
    `traj_num_rows` still counts the full batch."""
    prompt_len = batch.input_ids.shape[1] - batch.response_length
    attention = batch.attention_mask[index]
    keep_prompt = int(attention[:, :prompt_len].sum(-1).max())
    keep_response = int(batch.response_mask[index].sum(-1).max())
    cols = slice(prompt_len - keep_prompt, prompt_len + keep_response)
    allowed = batch.allowed_ids
    return TokenBatch(
        input_ids=batch.input_ids[index, cols],
        attention_mask=attention[:, cols],
        position_ids=batch.position_ids[index, cols],
        responses=batch.responses[index, :keep_response],
        response_mask=batch.response_mask[index, :keep_response],
        sampler_logp=batch.sampler_logp[index, :keep_response],
        allowed_ids=None if allowed is None else allowed[index, :keep_response],
        episode_scores=batch.episode_scores[index],
        action_valid=batch.action_valid[index],
        group_index=batch.group_index[index],
        traj_index=batch.traj_index[index],
        traj_num_rows=batch.traj_num_rows[index],
        row_index=batch.row_index[index],
        policy_version=batch.policy_version[index],
        anchor_index=None if batch.anchor_index is None else batch.anchor_index[index],
        step_returns=None if batch.step_returns is None else batch.step_returns[index],
    )
