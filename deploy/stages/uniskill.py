"""UniSkill's stage of the training step (the trainer holds one): the pure glue of
`deploy.stages.uniskill_glue` bundled with the bank, the critic and the proposal generator, which are
injected (`make_stage` builds them for a run: the bank actor through
`deploy.skillbank_actor.RemoteSkillBank`, generation through `deploy.cluster.Cluster`; tests pass
fakes or local objects).

    stage.retrieve(tasks)                 -> task_id -> skill text for the actor slot
    stage.propose(trajectories, step=)    -> ProposalBatch (candidates, prompts, gens, parsed, verdicts)
    stage.learner_inputs(batch, rows)     -> (ProposalRows, AlignRequests) for learner.train_step
    stage.commit(batch, scores)           -> metrics; the bank write, after the update
                                             (and batch.records: one ProposalRecord per proposal)
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from deploy.config import TrainConfig
from deploy.config_uniskill import UniSkillConfig
from deploy.stages.uniskill_glue import (
    Critic,
    ProposalRequest,
    ProposalWorkers,
    ProposerPrompt,
    SkillRetriever,
    actor_skill_texts,
    align_requests,
    build_candidates,
    generate_proposals,
    in_warmup,
    judge,
    parse_proposals,
    proposal_metrics,
    proposal_rows,
    proposer_prompts,
    retrieve_skills,
    rows_index,
    scored_proposals,
    switches,
)
from envs.types import TaskSpec
from learner.config import ProposerLossConfig
from learner.types import AlignRequest, ProposalRow, ProposalScore, TrainRow
from rollout_workers.config import RolloutConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.prompts import render_prompt_ids
from rollout_workers.proposer import ParsedProposal, op_first_token_ids
from rollout_workers.types import AnyTrajectory, Generation
from skillbank_service.types import (
    ApplyResult,
    CriticVerdict,
    Decision,
    ScoredProposal,
    Skill,
)

log = logging.getLogger(__name__)

# ---- the proposal archive ------------------------------------------------------------------


class ProposalRecord(BaseModel):
    """One proposal as archived in RUN/uniskill/proposals_step_N.jsonl (for analysis only, e.g.
    `analyze ralign-vs-rollout`): what was proposed (op, s~ = `text`) for which task, against which
    skill (`orig_text` = s_orig of S4: the text the actor's prompts showed in the anchor episodes,
    None when they showed none; `orig_skill_id` = the retrieved skill, the UPDATE target), what the
    learner scored (raw R_align parts, r_skill, reward) and what the critic and the bank decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    candidate_id: str
    task: TaskSpec
    task_type: str
    op: str | None
    """The parsed op ("no_edit" / "add" / "update"); None when the output did not parse."""
    text: str = ""
    orig_text: str | None = None
    orig_skill_id: str | None = None
    warmup: bool = False
    source_id: str | None = None
    """The trajectory the proposer saw (its opposite-outcome reference is `reference_id`)."""
    reference_id: str | None = None
    plus_id: str | None = None
    """R_align's success anchor tau+ (a trajectory id of the step's archive)."""
    minus_id: str | None = None
    """R_align's failure anchor tau-."""
    coverage_plus: float | None = None
    """Scorable-turn coverage |S_tau| / T_tau of tau+ as the learner measured it (None: no R_align was
    asked for: warm-up, NO_SKILL or a parse failure)."""
    coverage_minus: float | None = None
    r_align: float | None = None
    delta_plus: float | None = None
    delta_minus: float | None = None
    r_skill: float | None = None
    reward: float | None = None
    score_valid: bool | None = None
    score_reason: str = ""
    verdict_passed: bool | None = None
    verdict_reason: str = ""
    decision: str | None = None
    """The bank's outcome ("accepted", "rejected", ...); None when nothing was applied (warm-up)."""
    decision_reason: str = ""
    skill_id: str | None = None
    """The bank skill the accepted edit wrote."""


def proposal_records(batch: ProposalBatch, scores: Sequence[ProposalScore],
                     decisions: Sequence[Decision] = ()) -> list[ProposalRecord]:
    """One record per proposal of the batch (pure): prompt, parse, learner score, verdict, decision."""
    trajs = {t.traj_id: t for t in batch.trajectories}
    by_score = {s.candidate_id: s for s in scores}
    by_decision = {d.candidate_id: d for d in decisions}
    out = []
    for p, q in zip(batch.prompts, batch.parsed, strict=True):
        cid = p.candidate.candidate_id
        s, v, d = by_score.get(cid), batch.verdicts.get(cid), by_decision.get(cid)
        scored = not batch.warmup and q.ok and q.op in ("add", "update")  # R_align asked for: coverage measured
        out.append(ProposalRecord(
            step=batch.step, candidate_id=cid, task=trajs[p.candidate.source_id].task, task_type=p.task_type,
            op=q.op if q.ok else None, text=q.skill_text, warmup=batch.warmup,
            source_id=p.candidate.source_id, reference_id=p.candidate.reference_id,
            plus_id=p.candidate.plus_id, minus_id=p.candidate.minus_id,
            coverage_plus=s.coverage_plus if s and scored else None,
            coverage_minus=s.coverage_minus if s and scored else None,
            orig_text=trajs[p.candidate.plus_id].skill_text,
            orig_skill_id=p.skill.skill_id if p.skill is not None else None,
            r_align=s.r_align if s else None, delta_plus=s.delta_plus if s else None,
            delta_minus=s.delta_minus if s else None, r_skill=s.r_skill if s else None,
            reward=s.reward if s else None, score_valid=s.valid if s else None, score_reason=s.reason if s else "",
            verdict_passed=v.passed if v else None, verdict_reason=v.reason if v else "",
            decision=d.outcome if d else None, decision_reason=d.reason if d else "",
            skill_id=d.skill_id if d else None))
    return out


# ---- the stage ---------------------------------------------------------------------


class SkillBank(SkillRetriever, Protocol):
    def apply(self, proposals: Sequence[ScoredProposal]) -> ApplyResult: ...


@dataclass
class ProposalBatch:
    """One step's proposals between `UniSkillStage.propose` and `commit`."""

    step: int
    warmup: bool
    trajectories: Sequence[AnyTrajectory] = ()
    prompts: list[ProposerPrompt] = field(default_factory=list)
    gens: list[Generation] = field(default_factory=list)
    parsed: list[ParsedProposal] = field(default_factory=list)
    verdicts: dict[str, CriticVerdict] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    records: list[ProposalRecord] = field(default_factory=list)
    """Filled by `UniSkillStage.commit`: the archive of this step's proposals (MetricsSink.save_proposals)."""


class UniSkillStage:
    """UniSkill's stages of one training step, with the bank, the critic, the proposal generator
    and the tokenizer injected (the trainer builds them with `make_stage`; tests pass fakes).

    retrieve(tasks) -> skill texts for the actor; propose(trajectories, step) -> ProposalBatch;
    learner_inputs(batch, rows) -> (ProposalRows, AlignRequests); commit(batch, scores) -> metrics.
    """

    def __init__(self, u: UniSkillConfig, rollout: RolloutConfig, proposer_loss: ProposerLossConfig, *,
                 bank: SkillBank, critic: Critic | None, tokenizer,
                 generate: Callable[[Sequence[ProposerPrompt], int], list[Generation]],
                 close: Callable[[], None] | None = None):
        self.u, self.rollout, self.proposer_loss = u, rollout, proposer_loss
        self._close = close
        self.bank, self.critic, self.tokenizer, self._generate = bank, critic, tokenizer, generate
        self.switches = switches(self.u)
        self.op_ids = op_first_token_ids(tokenizer) if self.switches.proposer else None
        self.skills: dict[str, Skill | None] = {}

    def retrieve(self, tasks: Sequence[TaskSpec], *, evaluation: bool = False) -> dict[str, str | None]:
        """Retrieve for this step's (or the evaluation's) tasks; task_id -> actor slot text."""
        skills = retrieve_skills(self.bank, tasks, self.u)
        if not evaluation:
            self.skills = skills
        return actor_skill_texts(skills, self.u, evaluation=evaluation)

    def propose(self, trajectories: Sequence[AnyTrajectory], *, step: int) -> ProposalBatch:
        """Candidates, proposer prompts, generation (pre-update weights) and parsing; the critic
        after warm-up. Empty when the variant has no proposer."""
        batch = ProposalBatch(step=step, warmup=in_warmup(self.u, step), trajectories=trajectories)
        if not self.switches.proposer:
            return batch
        seed = derive_seed(self.rollout.seed, step)
        cands = build_candidates(trajectories, random.Random(seed), self.u)
        batch.prompts, too_long = proposer_prompts(cands, trajectories, self.skills, self.tokenizer, self.u)
        batch.gens = self._generate(batch.prompts, seed) if batch.prompts else []
        batch.parsed = parse_proposals(batch.prompts, batch.gens, self.u)
        if not batch.warmup and self.critic is not None:
            batch.verdicts = judge(self.critic, batch.prompts, batch.parsed,
                                   min_chars=self.u.bank.min_chars, max_chars=self.u.bank.max_chars)
        batch.metrics = proposal_metrics(batch.prompts, batch.parsed, too_long)
        if batch.verdicts:
            vs = list(batch.verdicts.values())
            batch.metrics["uniskill/critic_pass_rate"] = sum(v.passed for v in vs) / len(vs)
            batch.metrics["uniskill/critic_failures"] = float(sum(v.failed for v in vs))
            failed = [v.reason for v in vs if v.failed]
            if failed:
                log.warning("step %d: the critic failed on %d of %d proposals (they are rejected); first: %s",
                            step, len(failed), len(vs), failed[0])
        return batch

    def learner_inputs(self, batch: ProposalBatch, rows: Sequence[TrainRow]) -> tuple[list[ProposalRow],
                                                                                    list[AlignRequest]]:
        """ProposalRows for the proposer loss and, after warm-up, AlignRequests over the actor rows."""
        if not batch.prompts or self.op_ids is None:
            return [], []
        props = proposal_rows(batch.prompts, batch.gens, batch.parsed, batch.verdicts, self.op_ids,
                              eta=self.proposer_loss.eta)
        if batch.warmup:
            return props, []
        trained = {r.candidate_id for r in props}
        keep = [i for i, p in enumerate(batch.prompts) if p.candidate.candidate_id in trained]
        align, skipped = align_requests([batch.prompts[i] for i in keep], [batch.parsed[i] for i in keep],
                                        rows_index(rows), batch.trajectories,
                                        self.tokenizer, self.rollout,
                                        max_prompt_tokens=self.rollout.max_prompt_tokens)
        batch.metrics["uniskill/align_requests"] = float(len(align))
        batch.metrics["uniskill/align_too_long"] = float(len(skipped))
        return props, align

    def close(self) -> None:
        """End of run: stop the bank (unless uniskill.detached keeps it for later inspection)."""
        if self._close is not None:
            self._close()
            self._close = None

    def commit(self, batch: ProposalBatch, scores: Sequence[ProposalScore]) -> dict[str, float]:
        """Apply the step's proposals to the bank (after the update; nothing in warm-up or without
        a proposer); returns the batch's metrics plus bank counters. Sets `batch.records`."""
        out = dict(batch.metrics)
        if batch.warmup or not batch.prompts:
            batch.records = proposal_records(batch, scores)
            return out
        proposals = scored_proposals(batch.prompts, batch.parsed, batch.verdicts, scores, step=batch.step,
                                     coverage_min=self.proposer_loss.coverage_min)
        result = self.bank.apply(proposals)
        batch.records = proposal_records(batch, scores, result.decisions)
        out.update({"uniskill/bank_version": float(result.bank_version), "uniskill/added": float(result.num_added),
                    "uniskill/updated": float(result.num_updated)})
        if result.replayed:  # decisions recorded by an earlier attempt of this commit (a restart mid-call)
            out["uniskill/bank_replayed"] = float(result.replayed)
        for d in result.decisions:  # every proposal's recorded outcome (accepted, rejected: <reason>, ...)
            key = f"uniskill/decision_{d.outcome}"
            out[key] = out.get(key, 0.0) + 1.0
        return out


# ---- wiring for a run --------------------------------------------------------------------------


def policy_generate(workers: ProposalWorkers, tokenizer, *, max_tokens: int) -> Callable[[str], str]:
    """`generate(prompt) -> text` for the policy critic: greedy, on the first rollout worker."""

    def generate(prompt: str) -> str:
        ids = render_prompt_ids(tokenizer, prompt)
        request = ProposalRequest(prompt_ids=[ids], max_tokens=max_tokens, temperature=0.0, seed=0)
        return workers.generate_proposals([request])[0][0].text

    return generate


def make_stage(cfg: TrainConfig, workers: ProposalWorkers) -> UniSkillStage | None:
    """The trainer's UniSkill stage (None when UniSkill is off): the bank actor of this run
    (namespace = run.name), the configured critic (none without a proposer) and generation on the
    rollout workers (`deploy.cluster.Cluster`)."""
    if not cfg.uniskill.enabled:
        return None
    from transformers import AutoTokenizer

    from deploy.skillbank_actor import RemoteSkillBank, get_or_create_skillbank, shutdown_skillbank
    from skillbank_service.critics import build_critic

    u = cfg.uniskill
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    bank_cfg = u.bank
    if bank_cfg.url is None and bank_cfg.data_dir is None:
        # The private server keeps its AOF in the run directory, so `train --resume` continues
        # with the bank the run had built (and the history survives the run for inspection).
        bank_cfg = bank_cfg.model_copy(update={"data_dir": str(Path(cfg.run.output_dir).resolve() / "skillbank")})
    handle = get_or_create_skillbank(bank_cfg, namespace=cfg.ray.namespace or cfg.run.name, detached=u.detached)
    critic = None
    if switches(u).proposer:
        gen = policy_generate(workers, tokenizer, max_tokens=u.bank.llm.max_tokens) if u.bank.critic == "policy" else None
        critic = build_critic(u.bank.critic, llm=u.bank.llm, generate=gen)
    return UniSkillStage(u, cfg.rollout, cfg.learner.proposer, bank=RemoteSkillBank(handle), critic=critic, tokenizer=tokenizer,
                         generate=lambda prompts, seed: generate_proposals(workers, prompts, u, seed=seed),
                         close=None if u.detached else lambda: shutdown_skillbank(handle))
