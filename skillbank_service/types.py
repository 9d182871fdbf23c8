"""Contracts of the skill-bank service (stdlib + pydantic only).

Invariants:
- A `Skill` is the bank's current state of one entry; `revision` starts at 1 on ADD and grows by one
  per applied UPDATE. Its `provenance` names the proposal that produced the current text.
- Every `ScoredProposal` passed to `apply` gets exactly one `Decision`; only decisions with
  outcome "accepted" change the bank, and each accepted decision has exactly one `HistoryEntry`.
- R_align, delta+ and delta- are the raw, unclipped values of docs/algorithms.md S4 (the clip to +-eta
  is a reward-shaping concern of the learner, never of the bank).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

EditOp = Literal["no_edit", "add", "update"]
Outcome = Literal["accepted", "rejected", "superseded", "duplicate", "warmup", "invalid_text"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CriticVerdict(_Frozen):
    """A critic's judgement of one proposal. `passed` = op_reasonable and content_supported, and False
    whenever the critic failed (timeout, bad JSON), with the failure in `reason`."""

    op_reasonable: bool
    content_supported: bool
    passed: bool
    reason: str = ""
    critic: str
    """Which critic judged: "rule", "llm", "policy"."""
    failed: bool = False
    """True when the critic could not give a verdict (the booleans are then False)."""


class TrajectoryEvidence(_Frozen):
    """One trajectory as a critic's op rule reads it: its outcome and its valid env actions in order."""

    won: bool
    actions: tuple[str, ...] = ()


class CriticRequest(_Frozen):
    """What a critic sees: the proposed edit, the trajectory it came from (rendered as text), the
    opposite-outcome reference of the same task that the proposer saw, and the skill that was
    retrieved for that trajectory, if any (UPDATE is legal only when one was)."""

    candidate_id: str
    op: EditOp
    task_type: str
    text: str = ""
    source_trajectory: str
    """The source trajectory as text: task, observations and actions in order."""
    reference_trajectory: str = ""
    """The opposite-outcome reference as text ("" when not given)."""
    source: TrajectoryEvidence | None = None
    """The source's outcome and actions (None: not given; then no rule about NO_SKILL applies)."""
    reference: TrajectoryEvidence | None = None
    """The reference's outcome and actions (None: not given)."""
    retrieved_skill_id: str | None = None
    retrieved_skill_text: str | None = None
    instance_pattern: str | None = None
    """The environment's pattern of instance-specific text (`envs.api.SkillVocabulary`), which the rule
    critic refuses in a skill; None: the default (object numbers such as "cabinet 3", product ids)."""


class ScoredProposal(_Frozen):
    """One proposer output after parsing, R_align scoring and the critic (the input of `apply`)."""

    candidate_id: str
    step: int = Field(ge=0)
    """Global training step the proposal was generated at (warm-up: step <= warmup_steps)."""
    op: EditOp
    target_skill_id: str | None = None
    """UPDATE only: the retrieved skill the proposal rewrites."""
    task_type: str
    text: str = ""
    source_trajectory_ids: tuple[str, ...] = ()
    r_align: float | None = None
    """Raw R_align = delta+ - delta- (None when scoring failed or was masked)."""
    delta_plus: float | None = None
    delta_minus: float | None = None
    coverage_ok: bool = True
    """Both anchors had scorable coverage >= 0.8 (S4)."""
    verdict: CriticVerdict | None = None
    r_fmt_ok: bool = True
    """The proposer output parsed (r_fmt = +eta)."""


class Provenance(_Frozen):
    """Where a skill's current text came from."""

    candidate_id: str
    step: int
    source_trajectory_ids: tuple[str, ...] = ()
    r_align: float
    delta_plus: float
    delta_minus: float | None = None
    verdict: CriticVerdict | None = None


class Skill(_Frozen):
    """One bank entry (stored as JSON; its embedding is stored next to it)."""

    skill_id: str
    task_type: str
    text: str
    revision: int = Field(ge=1)
    provenance: Provenance
    schema_version: int = SCHEMA_VERSION


class HistoryEntry(_Frozen):
    """One applied edit, appended to the bank history in the same transaction as the edit (the
    list order is the commit order)."""

    op: Literal["add", "update"]
    skill_id: str
    revision: int
    task_type: str
    text: str
    previous_text: str | None = None
    candidate_id: str
    step: int
    r_align: float


class Decision(_Frozen):
    """The recorded fate of one proposal (appended to the decisions log)."""

    candidate_id: str
    step: int
    op: EditOp | None
    """None only for an input that did not parse as a proposal (outcome "rejected", reason "malformed")."""
    outcome: Outcome
    reason: str = ""
    """Why it was not accepted (a short machine-friendly tag, then details after ': ')."""
    skill_id: str | None = None
    revision: int | None = None


class ApplyResult(_Frozen):
    """Result of one `apply` call: a decision per proposal, in input order."""

    bank_version: int
    decisions: tuple[Decision, ...]
    num_added: int
    num_updated: int
    attempts: int = 1
    """Optimistic-transaction attempts (> 1 when a concurrent writer raced this one)."""
    replayed: int = Field(0, ge=0)
    """Inputs whose candidate id already had a decision: their recorded decision is returned and
    nothing is written again (a repeated call after a lost reply or a restart)."""


class RetrievedSkill(_Frozen):
    skill: Skill
    score: float
    """Cosine similarity between the query and the skill text embeddings."""


class BankSnapshot(_Frozen):
    version: int
    skills: tuple[Skill, ...]


class BankStats(_Frozen):
    version: int
    num_skills: dict[str, int]
    """Skills per task type."""
    adds: int
    updates: int
    decisions: dict[str, int]
    """Decisions per outcome."""
    rejections: dict[str, int]
    """Non-accepted decisions per reason tag."""
