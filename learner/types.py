"""Contracts of the learner: the row it trains on, the collated tensor batch, the step metrics.

Imports only stdlib and pydantic at run time (`torch` appears in annotations only), so `deploy`
can build `TrainRow`s without loading torch through this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    import torch


class TrainRow(BaseModel):
    """One training row = one environment turn, token-in/token-out.

    Invariants: `response_ids` is non-empty and ends with whatever the engine emitted (EOS
    included when it stopped); `sampler_logprobs` aligns 1:1 with `response_ids`; when
    `allowed_token_ids` is set it has one non-empty entry per response id and entry t contains
    response_ids[t]. `episode_score` is the trajectory's outcome R(tau), shared by all its rows;
    the invalid-action penalty is applied by the learner, not here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    allowed_token_ids: tuple[tuple[int, ...], ...] | None = None
    group_id: str
    traj_id: str
    step_idx: int
    episode_score: float
    action_valid: bool
    teacher_prompt_ids: tuple[int, ...] | None = None
    """SMRC-SD: the teacher-context prompt of this turn (routed turns only; None = no
    distillation). The learner scores the identical response ids under it, no grad, at θ_old."""
    anchor_key: str = ""
    """GiGPO (docs/algorithms.md "GiGPO"): digest of the exact environment observation this turn
    acted on (`learner.gigpo.anchor_key`); turns of one group with equal keys form an anchor-state
    group. "" = unknown (rows built by hand): the row is an anchor group of its own (A_step = 0)."""
    step_return: float = 0.0
    """GiGPO: the discounted return sum_k gamma^k r_{t+k} of the env rewards from this turn on."""
    payload_mask: tuple[bool, ...] | None = None
    """UniSkill R_align (docs/algorithms.md S4): one flag per response id, True inside the
    `<action>...</action>` payload (tags and think tokens excluded). None = the learner derives it
    from the tokenizer when the row is an alignment anchor (`learner.payload`)."""
    policy_version: int | None = None
    """The policy version the engine held when it sampled this turn (`Trajectory.policy_version`,
    stamped by the rollout worker); the learner's version minus it is the row's staleness
    (docs/algorithms.md "Off-policy correction"). None = unknown (rows built by hand)."""

    @model_validator(mode="after")
    def _aligned(self) -> TrainRow:
        n = len(self.response_ids)
        if n == 0 or not self.prompt_ids:
            raise ValueError("a row needs a non-empty prompt and response")
        if self.policy_version is not None and self.policy_version < 0:
            raise ValueError(f"policy_version must be >= 0 or None, got {self.policy_version}")
        if len(self.sampler_logprobs) != n:
            raise ValueError(f"sampler_logprobs ({len(self.sampler_logprobs)}) != response_ids ({n})")
        if self.payload_mask is not None and len(self.payload_mask) != n:
            raise ValueError(f"payload_mask ({len(self.payload_mask)}) needs one flag per response id ({n})")
        if self.allowed_token_ids is not None:
            if len(self.allowed_token_ids) != n:
                raise ValueError("allowed_token_ids needs one entry per response id")
            for t, (tok, allowed) in enumerate(zip(self.response_ids, self.allowed_token_ids)):
                if tok not in allowed:
                    raise ValueError(f"response id {tok} at position {t} is not in its allowed set")
        return self


ProposalOp = Literal["no_edit", "add", "update"]
OP_ORDER: tuple[ProposalOp, ...] = ("no_edit", "add", "update")
"""The order of `ProposalRow.op_token_ids` / `legal_ops`: NO_SKILL, ADD_NEW_SKILL, UPDATE_SKILL."""


class ProposalRow(BaseModel):
    """One UniSkill proposer sample (docs/algorithms.md S3), token-in/token-out.

    `response_ids` are the generated tokens (EOS included); a prefilled "<action>" is the end of
    `prompt_ids`, not part of the response, so it never carries an advantage. `op_position` is
    the index in `response_ids` of the op token: the logits predicting it (the decision
    position) feed the support regulariser; None = no decision position (no regulariser).
    `sampler_logprobs` are informational: the learner recomputes theta_old for proposals (S3).
    `op` is None on a parse failure. Rewards: `r_fmt` always; `r_op` (critic) and
    `content_supported` (critic) are None when not judged (warm-up, critic failure).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sampler_logprobs: tuple[float, ...] | None = None
    op_position: int | None
    op_token_ids: tuple[int, int, int]
    legal_ops: tuple[bool, bool, bool]
    op: ProposalOp | None
    r_fmt: float
    r_op: float | None = None
    content_supported: bool | None = None
    has_chinese: bool = False

    @model_validator(mode="after")
    def _check(self) -> ProposalRow:
        n = len(self.response_ids)
        if n == 0 or not self.prompt_ids:
            raise ValueError(f"proposal {self.candidate_id!r} needs a non-empty prompt and response")
        if self.sampler_logprobs is not None and len(self.sampler_logprobs) != n:
            raise ValueError(
                f"proposal {self.candidate_id!r}: sampler_logprobs ({len(self.sampler_logprobs)}) != response_ids ({n})"
            )
        if self.op_position is not None and not 0 <= self.op_position < n:
            raise ValueError(
                f"proposal {self.candidate_id!r}: op_position {self.op_position} outside the response (0..{n - 1})"
            )
        if len(set(self.op_token_ids)) != 3:
            raise ValueError(f"proposal {self.candidate_id!r}: op_token_ids must be 3 distinct ids")
        return self


class AlignAnchor(BaseModel):
    """One turn of an R_align anchor trajectory (S4). `row_index` indexes the actor rows of the
    same `train_step` (their theta_old log-probs give J(tau; s_orig)); `swapped_prompt_ids` is
    that turn's prompt with the skill slot filled with the candidate skill s~ (same generation
    header), scored with the identical response ids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row_index: int
    swapped_prompt_ids: tuple[int, ...]


class AlignRequest(BaseModel):
    """R_align inputs of one candidate: every turn of the success anchor (`plus`) and of the
    failure anchor (`minus`); `plus_turns` / `minus_turns` are T_tau (coverage denominators)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_id: str
    plus: tuple[AlignAnchor, ...]
    minus: tuple[AlignAnchor, ...]
    plus_turns: int
    minus_turns: int

    @model_validator(mode="after")
    def _check(self) -> AlignRequest:
        for name, anchors, turns in (
            ("plus", self.plus, self.plus_turns),
            ("minus", self.minus, self.minus_turns),
        ):
            if turns < 1 or len(anchors) > turns:
                raise ValueError(
                    f"align {self.candidate_id!r}: {name}_turns ({turns}) must be >= 1 and >= len({name}) "
                    f"({len(anchors)})"
                )
        return self


class ProposalScore(BaseModel):
    """What the learner made of one proposal: R_align parts (raw, unclipped), coverage, the
    clipped r_skill, the composite reward, the whitened advantage; `valid` = used in the
    proposer loss, `reason` = why not (or what was special, e.g. "warm-up"); "" when nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_id: str
    r_align: float | None
    delta_plus: float | None
    delta_minus: float | None
    coverage_plus: float
    coverage_minus: float
    r_skill: float | None
    reward: float | None
    advantage: float | None
    valid: bool
    reason: str = ""


@dataclass(frozen=True)
class TokenBatch:
    """Collated rows. B rows, L_p = longest prompt, L_r = longest response, L = L_p + L_r.

    Layout (verl's): prompts LEFT-padded to L_p, responses RIGHT-padded to L_r, so the response
    always starts at column L_p and logits[:, L_p-1 : L-1] predict `responses`.
    `response_mask` counts generated tokens only (EOS included), never the prompt or padding.
    """

    input_ids: torch.Tensor  # (B, L) int64: left-padded prompt ++ right-padded response
    attention_mask: torch.Tensor  # (B, L) int64: 1 on real prompt/response tokens
    position_ids: torch.Tensor  # (B, L) int64: cumsum(attention_mask) - 1, clamped at 0
    responses: torch.Tensor  # (B, L_r) int64: response ids (pad id after the end)
    response_mask: torch.Tensor  # (B, L_r) float32: 1 on generated tokens
    sampler_logp: torch.Tensor  # (B, L_r) float32: engine log-probs (0 on padding)
    allowed_ids: torch.Tensor | None  # (B, L_r, K) int64: allowed ids per position, -1 = empty slot;
    #   a position whose K slots are all -1 is unconstrained. None when no row is constrained.
    episode_scores: torch.Tensor  # (B,) float32: R(tau) of the row's trajectory
    action_valid: torch.Tensor  # (B,) bool
    group_index: torch.Tensor  # (B,) int64: dense index of group_id
    traj_index: torch.Tensor  # (B,) int64: dense index of (group_id, traj_id)
    traj_num_rows: torch.Tensor  # (B,) int64: rows of the row's trajectory in the full batch
    row_index: torch.Tensor  # (B,) int64: position of the row in the list given to collate
    policy_version: torch.Tensor  # (B,) int64: TrainRow.policy_version, -1 = unknown (staleness)
    anchor_index: torch.Tensor | None = None  # (B,) int64: dense index of (group_id, anchor_key) (GiGPO)
    step_returns: torch.Tensor | None = None  # (B,) float32: TrainRow.step_return (GiGPO)

    @property
    def num_rows(self) -> int:
        return int(self.responses.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.responses.shape[1])


@dataclass(frozen=True)
class MicroBatchView:
    """What an extra loss term sees for one micro-batch of the PPO update (B_m rows, L_m columns;
    the micro-batch is trimmed, so L_m <= L_r of the full batch; `batch.row_index` maps its rows
    back to the rows given to `train_step`). `batch` stays on the CPU; the tensors below are on
    the training device. The `global_*` counts are over the whole mini-batch on all ranks, so a
    term aggregated with them sums to the full-batch value over micro-batches and ranks."""

    batch: TokenBatch
    logp: torch.Tensor  # (B_m, L_m) float32 with grad: current policy
    old_logp: torch.Tensor  # (B_m, L_m) float32: theta_old, computed at step start (no grad)
    advantages: torch.Tensor  # (B_m, L_m) float32: GRPO advantage broadcast over the response mask
    row_weights: torch.Tensor  # (B_m,) float32: row weighting (0 for padding rows of uneven ranks)
    global_num_tokens: float  # weighted response tokens of the whole mini-batch on all ranks
    global_matched_tokens: float = 0.0
    """The same over the mini-batch's rows with a `teacher_prompt_ids` (SMRC-SD's M_i = 1; the
    "matched_tokens" SD denominator); 0 when the step has no teacher pass."""


Chunk = tuple["torch.Tensor", bool]
"""One micro-batch: (row indices, real); real=False is a zero-weight padding micro-batch that
only keeps the ranks' forward/backward counts equal (`learner.sharding`)."""


class ExtraLoss(Protocol):
    """Seam for an additional loss term on the actor's micro-batches (SMRC-SD routed distillation,
    `learner.distill.RoutedSDLoss`).

    Called once per actor micro-batch; must return a scalar already aggregated with global
    denominators (e.g. sum(m * l) / view.global_num_tokens) and already multiplied by its
    coefficient. It is added to the GRPO loss before backward and logged under `name`
    (`StepMetrics.extra_losses`). A hook with a `sums() -> dict[str, float]` method (this rank's
    raw diagnostic sums) also has them summed over ranks into the step's sums as `name/key`, where
    its method's metrics read them (e.g. `learner.teacher_pass.sd_metrics`).
    """

    name: str

    def __call__(self, view: MicroBatchView) -> torch.Tensor: ...


class AuxiliaryLoss(Protocol):
    """Seam for an additional loss term on rows of its own, the sibling of `ExtraLoss` (UniSkill's
    proposer loss on the proposal rows, `learner.proposer_loss.ProposerLoss`).

    Optimiser step k (actor mini-batch k) backpropagates the actor micro-batches, then each of
    `micro_batches(k)` (this rank's share of the term's rows for step k, padded to the same count
    on every rank) through `__call__(rows, real, k)`, then steps once. Same contract as
    `ExtraLoss`: a scalar already aggregated with global denominators and multiplied by its
    coefficient; a padding micro-batch (real=False) must contribute exactly 0. Its value is added
    to the step's `loss`; `sums()` (this rank's raw sums) are summed over ranks as `name/key`
    (e.g. `learner.proposer_loss.proposal_metrics`).
    """

    name: str

    def micro_batches(self, k: int) -> list[Chunk]: ...

    def __call__(self, rows: torch.Tensor, real: bool, k: int) -> torch.Tensor: ...

    def sums(self) -> dict[str, float]: ...


class StageSeconds(BaseModel):
    """Wall-clock seconds spent in each stage of one `train_step`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    collate_s: float
    logprob_s: float
    advantage_s: float
    update_s: float
    total_s: float


class StepMetrics(BaseModel):
    """What one `train_step` reports. Token-level values are global token-means over all the
    step's response tokens (all epochs, all ranks); loss terms are the mean over optimiser steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy_version: int
    loss: float
    pg_loss: float
    kl_loss: float
    entropy_loss: float
    extra_losses: dict[str, float]
    pg_clipfrac: float
    pg_clipfrac_lower: float
    ppo_kl: float
    kl: float
    entropy: float
    grad_norm: float
    lr: float
    num_rows: int
    num_tokens: int
    num_optimizer_steps: int
    score_mean: float
    advantage_abs_mean: float
    response_length_mean: float
    rep4gram_ratio: float
    sampler_logp_abs_diff: float
    seconds: StageSeconds
    extra_metrics: dict[str, float] = {}
    """Optional diagnostics of extra losses (e.g. sd_match_rate, sd_teacher_tokens, sd_d_mean,
    sd_k_mean when SMRC-SD distillation is on; prop_* when UniSkill proposals were trained);
    empty otherwise."""
    proposal_scores: list[ProposalScore] = []
    """UniSkill: one entry per proposal given to `train_step`, in order; empty without proposals."""
