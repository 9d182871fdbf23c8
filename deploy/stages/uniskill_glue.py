"""UniSkill glue for the trainer (docs/algorithms.md S3-S5): one function per stage of a training
step, in the order the trainer calls them. Everything here is pure: generation on the rollout
workers comes in as a `ProposalWorkers` object (`deploy.cluster.Cluster` in a run).

    skills  = retrieve_skills(bank, tasks, cfg)                    # before collect
    shown   = actor_skill_texts(skills, cfg)                       # the actor's prompt slot
    (collect with `shown`; SMRC-SD routing if on)
    cands   = build_candidates(trajectories, rng, cfg)
    prompts = proposer_prompts(cands, trajectories, skills, tokenizer, cfg)
    gens    = generate_proposals(workers, prompts, cfg, seed=...)  # on the rollout workers
    parsed  = parse_proposals(prompts, gens, cfg)
    verdicts= judge(critic, prompts, parsed)                       # skipped in warm-up
    rows    = rows_from_trajectories(...)                          # actor rows (learner.batch)
    props   = proposal_rows(prompts, gens, parsed, verdicts, op_ids, eta=...)
    align   = align_requests(prompts, parsed, rows_index(rows), trajectories, tokenizer, rollout_cfg, ...)
    (learner.train_step(rows, props, align) -> ProposalScore per proposal)
    bank.apply(scored_proposals(prompts, parsed, verdicts, scores, step=...))   # after the update

`UniSkillStage` bundles these for the trainer (retrieve / propose / learner_inputs / commit) with
the bank, critic and generator injected; `make_stage` builds it for a run. The variant table
(actor_only / proposer_only / no_r_align / no_support_reg) lives in `deploy.config_uniskill.VARIANT_SWITCHES`;
`switches(cfg)` reads it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from deploy.config_uniskill import UNISKILL_OFF, VARIANT_SWITCHES, UniSkillConfig, VariantSwitches
from envs.types import TaskSpec
from learner.types import AlignAnchor, AlignRequest, ProposalRow, ProposalScore, TrainRow
from rollout_workers.config import RolloutConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.episode import Episode
from rollout_workers.prompts import render_prompt_ids
from rollout_workers.proposer import (
    ACTION_CLOSE,
    OP_TOKENS,
    ParsedProposal,
    group_members,
    legal_ops,
    parse_proposal,
    render_proposer_message,
    render_proposer_prompt_ids,
    render_trajectory,
    select_candidates,
)
from rollout_workers.turn_messages import recorded_turn_message
from rollout_workers.types import AnyTrajectory, Candidate, Generation, split_infrastructure_failures
from skillbank_service.critics import refused_text_verdict
from skillbank_service.types import (
    CriticRequest,
    CriticVerdict,
    RetrievedSkill,
    ScoredProposal,
    Skill,
    TrajectoryEvidence,
)
from skillbank_service.validation import validate_skill_text


def switches(cfg: UniSkillConfig) -> VariantSwitches:
    """The variant's switches; everything off when UniSkill is disabled."""
    return VARIANT_SWITCHES[cfg.variant] if cfg.enabled else UNISKILL_OFF


def in_warmup(cfg: UniSkillConfig, step: int) -> bool:
    """Global steps <= warmup_steps: r_fmt only (no critic, no R_align, no bank writes)."""
    return step <= cfg.bank.warmup_steps


# ---- 1. retrieval and the actor's prompt slot -------------------------------------------------


class SkillRetriever(Protocol):
    """The bank's read side (`skillbank_service.service.SkillBankService` has it)."""

    def retrieve_many(
        self, queries: Sequence[str], k: int | None = None, task_types: Sequence[str | None] | None = None
    ) -> list[list[RetrievedSkill]]: ...


def retrieve_skills(bank: SkillRetriever, tasks: Sequence[TaskSpec], cfg: UniSkillConfig) -> dict[str, Skill | None]:
    """task_id -> the top-1 skill of the task's type for its instruction (None: bank empty for that
    type). One batched query. Retrieval runs whenever UniSkill is on (the proposer needs the skill
    as its UPDATE target even when the actor does not see it)."""
    if not cfg.enabled or not tasks:
        return {t.task_id: None for t in tasks}
    unique = list({t.task_id: t for t in tasks}.values())
    hits = bank.retrieve_many([t.instruction for t in unique], k=cfg.bank.top_k,
                              task_types=[t.task_type for t in unique])
    return {t.task_id: (h[0].skill if h else None) for t, h in zip(unique, hits, strict=True)}


def actor_skill_texts(
    skills: Mapping[str, Skill | None], cfg: UniSkillConfig, *, evaluation: bool = False
) -> dict[str, str | None]:
    """task_id -> the text for the actor's skill slot: None when the variant hides skills from the
    actor (proposer_only) or at evaluation with retrieval_at_eval=false."""
    show = switches(cfg).actor_sees_skills and (cfg.retrieval_at_eval or not evaluation)
    return {tid: (s.text if s is not None and show else None) for tid, s in skills.items()}


# ---- 2. candidates and proposer prompts ---------------------------------------------------------


def build_candidates(trajectories: Sequence[AnyTrajectory], rng: random.Random, cfg: UniSkillConfig) -> list[Candidate]:
    """Candidates of docs/algorithms.md S3 from the step's groups (a group shares task, seed and
    retrieved skill). Trajectories without turns or ended by an env error take no part."""
    usable = [Episode(t) for t in split_infrastructure_failures(trajectories)[0] if t.turns]
    return select_candidates(group_members(usable), rng, max_candidates=cfg.max_candidates_per_step)


@dataclass(frozen=True)
class ProposerPrompt:
    """One proposer input: the candidate, its rendered prompt (ending with "<action>"), the legal
    ops, the retrieved skill (UPDATE target), and for the critic the source and the reference as
    the proposer saw them (text) and as outcome and actions (evidence)."""

    candidate: Candidate
    prompt_ids: tuple[int, ...]
    legal: tuple[bool, bool, bool]
    skill: Skill | None
    task_type: str
    source_text: str
    reference_text: str = ""
    source: TrajectoryEvidence | None = None
    reference: TrajectoryEvidence | None = None
    instance_pattern: str | None = None
    """The env's instance-specific text pattern (its plugin's vocabulary), for the rule critic."""


def trajectory_evidence(traj: AnyTrajectory) -> TrajectoryEvidence:
    """The trajectory's outcome and its valid env actions, in order."""
    return TrajectoryEvidence(won=traj.success, actions=tuple(t.env_action for t in traj.turns if t.action_valid))


def proposer_prompts(
    candidates: Sequence[Candidate],
    trajectories: Sequence[AnyTrajectory],
    skills: Mapping[str, Skill | None],
    tokenizer,
    cfg: UniSkillConfig,
) -> tuple[list[ProposerPrompt], int]:
    """The proposer prompt of each candidate, and how many were dropped for exceeding
    `proposer.max_prompt_tokens` (never truncated)."""
    by_id = {t.traj_id: t for t in trajectories}
    out, too_long = [], 0
    budget = cfg.proposer.trajectory_max_chars
    for c in candidates:
        src, ref = by_id[c.source_id], by_id[c.reference_id]
        skill = skills.get(c.task_id)
        legal = legal_ops(skill is not None)
        source_text = render_trajectory(src.turns, won=src.success, max_chars=budget)
        reference_text = render_trajectory(ref.turns, won=ref.success, max_chars=budget)
        profile = rollout_profile(src.task.env)
        message = render_proposer_message(
            setting=profile.proposer_setting,
            task=profile.task_text(src.task, src.turns[0].observation if src.turns else ""), source=source_text,
            source_won=src.success, reference=reference_text,
            skill_text=skill.text if skill is not None else None, legal=legal)
        ids = render_proposer_prompt_ids(tokenizer, message)
        if len(ids) > cfg.proposer.max_prompt_tokens:
            too_long += 1
            continue
        out.append(ProposerPrompt(c, tuple(ids), legal, skill, src.task.task_type, source_text, reference_text,
                                  trajectory_evidence(src), trajectory_evidence(ref), profile.instance_pattern))
    return out, too_long


# ---- 3. generation and parsing -------------------------------------------------------------


@dataclass(frozen=True)
class ProposalRequest:
    """One rollout worker's share of a step's proposals: the arguments of its
    `RolloutWorker.generate_proposals` call."""

    prompt_ids: list[list[int]]
    max_tokens: int
    temperature: float
    seed: int
    op_choices: list[list[str]] | None = None


class ProposalWorkers(Protocol):
    """Generation on the rollout workers' engines with the current weights
    (`deploy.cluster.Cluster`; tests pass fakes)."""

    @property
    def num_workers(self) -> int: ...

    def generate_proposals(self, requests: Sequence[ProposalRequest]) -> list[list[Generation]]:
        """requests[i] on worker i, all at once; one list of generations per request, in order."""
        ...


def proposal_requests(prompts: Sequence[ProposerPrompt], num_workers: int, cfg: UniSkillConfig, *,
                      seed: int) -> list[ProposalRequest]:
    """The prompts dealt round-robin (prompt j to worker j % num_workers): one request per worker
    that gets any, worker i sampling with seed derive_seed(seed, i)."""
    n = num_workers
    return [
        ProposalRequest(prompt_ids=[list(p.prompt_ids) for p in prompts[i::n]], max_tokens=cfg.proposer.max_tokens,
                        temperature=cfg.proposer.temperature, seed=derive_seed(seed, i),
                        op_choices=[op_choices(p.legal) for p in prompts[i::n]] if cfg.proposer.constrain_op else None)
        for i in range(n) if prompts[i::n]
    ]


def generate_proposals(workers: ProposalWorkers, prompts: Sequence[ProposerPrompt], cfg: UniSkillConfig, *,
                       seed: int) -> list[Generation]:
    """Proposals from the rollout workers' engines (current weights), split evenly across the
    workers; results in `prompts` order."""
    if not prompts:
        return []
    n = workers.num_workers
    shares = workers.generate_proposals(proposal_requests(prompts, n, cfg, seed=seed))
    out: list[Generation | None] = [None] * len(prompts)
    for i, share in enumerate(shares):
        for j, g in enumerate(share):
            out[i + j * n] = g
    return out  # type: ignore[return-value]


def op_choices(legal: tuple[bool, bool, bool]) -> list[str]:
    """The strings a constrained op decode may produce: each legal "<OP></action>"."""
    return [f"{tok}{ACTION_CLOSE}" for tok, ok in zip(OP_TOKENS, legal, strict=True) if ok]


def parse_proposals(prompts: Sequence[ProposerPrompt], gens: Sequence[Generation],
                    cfg: UniSkillConfig) -> list[ParsedProposal]:
    """Parse each generation against its candidate's legal ops (skill length capped as the bank's)."""
    return [parse_proposal(g.text, legal=p.legal, max_skill_chars=cfg.bank.max_chars)
            for p, g in zip(prompts, gens, strict=True)]


# ---- 4. the critic ------------------------------------------------------------------------------


class Critic(Protocol):
    """`skillbank_service.critics` (rule / llm / policy): one verdict per request, never raising."""

    def judge(self, request: CriticRequest) -> CriticVerdict: ...


def critic_requests(prompts: Sequence[ProposerPrompt], parsed: Sequence[ParsedProposal]) -> list[CriticRequest]:
    """One request per parsed proposal (parse failures get no critic: their reward is r_fmt)."""
    return [
        CriticRequest(candidate_id=p.candidate.candidate_id, op=q.op, task_type=p.task_type, text=q.skill_text,
                      source_trajectory=p.source_text, reference_trajectory=p.reference_text,
                      source=p.source, reference=p.reference,
                      retrieved_skill_id=p.skill.skill_id if p.skill else None,
                      retrieved_skill_text=p.skill.text if p.skill else None, instance_pattern=p.instance_pattern)
        for p, q in zip(prompts, parsed, strict=True) if q.ok and q.op is not None
    ]


def judge(critic: Critic, prompts: Sequence[ProposerPrompt], parsed: Sequence[ParsedProposal], *,
          min_chars: int, max_chars: int) -> dict[str, CriticVerdict]:
    """candidate_id -> the critic's verdict, for every parsed proposal (a failed verdict, e.g. an
    endpoint timeout, is kept: it masks r_op and blocks the bank write). ADD/UPDATE text the bank
    would refuse (length, charset, control characters, tags or instruction-like text) is judged
    unsupported whatever the critic says of its content, so the proposer's reward sees what the bank
    enforces; the critic's op judgement stands (the refusal is scored once, in r_skill)."""
    out = {}
    for r in critic_requests(prompts, parsed):
        judged = critic.judge(r)
        invalid = validate_skill_text(r.text, min_chars=min_chars, max_chars=max_chars) if r.op != "no_edit" else None
        out[r.candidate_id] = judged if invalid is None or judged.failed else refused_text_verdict(judged, invalid)
    return out


# ---- 5. learner inputs ----------------------------------------------------------------------------


def proposal_rows(
    prompts: Sequence[ProposerPrompt],
    gens: Sequence[Generation],
    parsed: Sequence[ParsedProposal],
    verdicts: Mapping[str, CriticVerdict],
    op_token_ids: tuple[int, int, int],
    *,
    eta: float,
) -> list[ProposalRow]:
    """One ProposalRow per proposal that generated tokens. r_fmt = +-eta; r_op = +-eta from the
    critic (None when not judged: warm-up, parse failure, critic failure); content_supported
    likewise (ADD/UPDATE only). The op decision is response position 0 ("<action>" prefilled)."""
    rows = []
    for p, g, q in zip(prompts, gens, parsed, strict=True):
        if not g.token_ids:
            continue
        v = verdicts.get(p.candidate.candidate_id)
        judged = v is not None and not v.failed and q.ok
        rows.append(ProposalRow(
            candidate_id=p.candidate.candidate_id, prompt_ids=p.prompt_ids, response_ids=g.token_ids,
            sampler_logprobs=g.logprobs, op_position=0, op_token_ids=op_token_ids, legal_ops=p.legal,
            op=q.op if q.ok else None, r_fmt=eta if q.ok else -eta,
            r_op=(eta if v.op_reasonable else -eta) if judged else None,
            content_supported=v.content_supported if judged and q.op != "no_edit" else None,
            has_chinese=q.has_chinese))
    return rows


def rows_index(rows: Sequence[TrainRow]) -> dict[tuple[str, int], int]:
    """(traj_id, turn index) -> position of that turn's actor row in the list given to train_step."""
    return {(r.traj_id, r.step_idx): i for i, r in enumerate(rows)}


def align_requests(
    prompts: Sequence[ProposerPrompt],
    parsed: Sequence[ParsedProposal],
    index: Mapping[tuple[str, int], int],
    trajectories: Sequence[AnyTrajectory],
    tokenizer,
    rollout: RolloutConfig,
    *,
    max_prompt_tokens: int,
) -> tuple[list[AlignRequest], dict[str, str]]:
    """R_align inputs (S4) for every parsed ADD/UPDATE: each turn of tau+ and tau- that has an actor
    row, its prompt re-rendered with s~ in the skill slot (replacing whatever was retrieved).
    Returns the requests and candidate_id -> reason for those left out (a swapped prompt longer
    than `max_prompt_tokens` invalidates its candidate)."""
    by_id = {t.traj_id: t for t in trajectories}
    requests, skipped = [], {}
    for p, q in zip(prompts, parsed, strict=True):
        if not q.ok or q.op not in ("add", "update"):
            continue
        cid = p.candidate.candidate_id
        sides = []
        for anchor_id in (p.candidate.plus_id, p.candidate.minus_id):
            traj = by_id[anchor_id]
            anchors = []
            for t in range(len(traj.turns)):
                row = index.get((anchor_id, t))
                if row is None:
                    continue
                ids = render_prompt_ids(tokenizer, recorded_turn_message(traj, t, rollout, skill_text=q.skill_text))
                if len(ids) > max_prompt_tokens:
                    skipped[cid] = f"prompt_too_long: {anchor_id} turn {t} has {len(ids)} tokens with s~"
                    break
                anchors.append(AlignAnchor(row_index=row, swapped_prompt_ids=tuple(ids)))
            sides.append((tuple(anchors), len(traj.turns)))
        if cid in skipped:
            continue
        (plus, plus_turns), (minus, minus_turns) = sides
        requests.append(AlignRequest(candidate_id=cid, plus=plus, minus=minus,
                                     plus_turns=plus_turns, minus_turns=minus_turns))
    return requests, skipped


# ---- 6. the bank commit ----------------------------------------------------------------------------


def scored_proposals(
    prompts: Sequence[ProposerPrompt],
    parsed: Sequence[ParsedProposal],
    verdicts: Mapping[str, CriticVerdict],
    scores: Sequence[ProposalScore],
    *,
    step: int,
    coverage_min: float = 0.8,
) -> list[ScoredProposal]:
    """What `SkillBankService.apply` takes: every proposal with its parse result, critic verdict
    and the learner's raw R_align parts (None when the learner did not score it)."""
    by_cid = {s.candidate_id: s for s in scores}
    out = []
    for p, q in zip(prompts, parsed, strict=True):
        c, s = p.candidate, by_cid.get(p.candidate.candidate_id)
        op = q.op or "no_edit"
        out.append(ScoredProposal(
            candidate_id=c.candidate_id, step=step, op=op,
            target_skill_id=p.skill.skill_id if op == "update" and p.skill is not None else None,
            task_type=p.task_type, text=q.skill_text,
            source_trajectory_ids=(c.source_id, c.reference_id, c.plus_id, c.minus_id),
            r_align=s.r_align if s else None, delta_plus=s.delta_plus if s else None,
            delta_minus=s.delta_minus if s else None,
            coverage_ok=bool(s) and min(s.coverage_plus, s.coverage_minus) >= coverage_min,
            verdict=verdicts.get(c.candidate_id), r_fmt_ok=q.ok))
    return out


def proposal_metrics(prompts: Sequence[ProposerPrompt], parsed: Sequence[ParsedProposal],
                     too_long: int) -> dict[str, float]:
    """uniskill/* metrics of one step: candidates, parse rate, op distribution (collapse check)."""
    n = len(parsed)
    out: dict[str, float] = {"uniskill/candidates": float(len(prompts) + too_long),
                             "uniskill/prompts_too_long": float(too_long), "uniskill/proposals": float(n)}
    if n:
        out["uniskill/parse_rate"] = sum(q.ok for q in parsed) / n
        for op in ("no_edit", "add", "update"):
            out[f"uniskill/op_{op}"] = sum(q.ok and q.op == op for q in parsed) / n
    return out



