"""The synchronous training loop (docs/architecture.md "one training step"). Each stage is a named call;
UniSkill retrieval (step 1), SMRC-SD routing (step 3), UniSkill proposals (step 4) and the
skill-bank commit (step 8, after the update) are stages that are no-ops for plain GRPO.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from deploy.cluster import Cluster
from deploy.config import TrainConfig
from deploy.evaluation import EvalResult, summarize_eval
from deploy.metrics import MetricsSink, rollout_metrics
from deploy.stages.smrc_sd import RoutingResult, TeacherRouter
from deploy.stages.uniskill import ProposalBatch, UniSkillStage
from envs.tasks import eval_tasks, sample_tasks
from learner.batch import rows_from_trajectories
from learner.types import StepMetrics
from rollout_workers.types import Trajectory, split_infrastructure_failures

log = logging.getLogger(__name__)


def step_seed(run_seed: int, step: int) -> int:
    """Per-step seed derived from (run seed, step): resuming reproduces the same task stream."""
    return zlib.crc32(f"{run_seed}:{step}".encode())


@dataclass
class StageTimer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        yield
        self.seconds[f"time/{stage}_s"] = time.perf_counter() - start


@dataclass
class TrainerState:
    """What the driver needs to resume. The driver draws no random numbers of its own: task
    streams derive from (run.seed, step) and sampling seeds from (rollout.seed, policy_version,
    call), so step + policy_version (plus the learner's checkpoint, which holds its RNG) suffice."""

    step: int = 0
    policy_version: int = 0

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"step": self.step, "policy_version": self.policy_version}))

    @classmethod
    def load(cls, path: Path) -> TrainerState:
        return cls(**json.loads(path.read_text()))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = sorted(p.parent for p in Path(run_dir, "checkpoints").glob("step_*/trainer_state.json"))
    return done[-1] if done else None


def make_router(cfg: TrainConfig) -> TeacherRouter | None:
    """The routing stage of a distilling method (None for plain GRPO)."""
    if cfg.method.name == "grpo":
        return None
    from transformers import AutoTokenizer

    m = cfg.method
    return TeacherRouter(
        method=m.name, matcher=m.matcher, parts=frozenset(m.context_parts) if m.context_parts is not None else None,
        audit_matchers=m.audit_matchers, rollout=cfg.rollout, tokenizer=AutoTokenizer.from_pretrained(cfg.model.path),
        max_chars=m.teacher_max_chars, seed=cfg.run.seed)


def make_skill_stage(cfg: TrainConfig, cluster: Cluster) -> UniSkillStage | None:
    """UniSkill's stage (None unless uniskill.enabled): the run's skill-bank actor, the critic and
    proposal generation on the rollout workers."""
    if not cfg.uniskill.enabled:
        return None
    from deploy.stages.uniskill import make_stage

    return make_stage(cfg, cluster)


def run_evaluation(cluster: Cluster, cfg: TrainConfig, *, label: str, policy_version: int,
                   skills: UniSkillStage | None = None) -> EvalResult:
    """Avg@k / Pass@k on the fixed evaluation set (same tasks every call); with UniSkill the
    actor sees retrieved skills unless `uniskill.retrieval_at_eval` is off."""
    from rich.console import Console

    tasks = eval_tasks(cfg.env, cfg.eval.split, cfg.eval.num_tasks)
    shown = skills.retrieve(tasks, evaluation=True) if skills is not None else None
    with Console(stderr=True).status(f"evaluating {label}: {len(tasks)} {cfg.eval.split} tasks x {cfg.eval.k} samples"):
        trajs, _ = cluster.collect(tasks, group_size=cfg.eval.k, policy_version=policy_version,
                                   temperature=cfg.eval.temperature, skill_texts=shown)
    return summarize_eval(trajs, label=label, split=cfg.eval.split, k=cfg.eval.k,
                          temperature=cfg.eval.temperature)


class Trainer:
    def __init__(self, cfg: TrainConfig, cluster: Cluster, sink: MetricsSink, state: TrainerState):
        self.cfg, self.cluster, self.sink, self.state = cfg, cluster, sink, state
        self.router = make_router(cfg)
        self.skills = make_skill_stage(cfg, cluster)

    # ---- one step, as a table of contents -------------------------------------------------
    def train_step(self, step: int) -> dict[str, float | int]:
        timer = StageTimer()
        with timer("sample"):
            tasks = sample_tasks(self.cfg.env, "train", self.cfg.rollout.tasks_per_step,
                                 step_seed(self.cfg.run.seed, step))
        with timer("retrieve"):
            shown = self.retrieve_skills(tasks)
        with timer("rollout"):
            trajs, rstats = self.cluster.collect(
                tasks, group_size=self.cfg.rollout.group_size, policy_version=self.state.policy_version,
                temperature=self.cfg.rollout.temperature, skill_texts=shown)
        played = self.exclude_infrastructure_failures(trajs, step)
        with timer("route"):
            routed = self.route(played, step)
        with timer("propose"):
            proposals = self.propose_skills(played, step)
        if self.cfg.run.save_trajectories:
            self.sink.save_trajectories(step, trajs)
        rows = rows_from_trajectories(played, routed.teacher_prompts or None)
        learn: dict[str, float] = {}
        scores: list = []
        if rows:  # every episode can end before its first turn (env errors): then no update
            prop_rows, align = self.skills.learner_inputs(proposals, rows) if proposals else ([], [])
            with timer("learn"):
                metrics = self.cluster.train(rows, prop_rows, align,
                                             proposer_warmup=proposals is not None and proposals.warmup)
                learn, scores = learner_log_dict(metrics), metrics.proposal_scores
            with timer("sync"):
                self.state.policy_version += 1
                self.cluster.sync_weights(self.state.policy_version)
        with timer("skill_commit"):
            committed = self.commit_skills(proposals, scores)
        self.sink.save_proposals(step, proposals.records if proposals is not None else [])
        self.state.step = step
        return {"step": step, "policy_version": self.state.policy_version,
                **rollout_metrics(trajs), **routed.metrics, **learn, **committed,
                "rollout/generate_s": rstats.generate_s, "rollout/env_s": rstats.env_s,
                **timer.seconds}

    @staticmethod
    def exclude_infrastructure_failures(trajectories: list[Trajectory], step: int) -> list[Trajectory]:
        """Episodes the env crashed under or whose prompt outgrew the budget say nothing about the
        policy: they leave the groups, the references and the proposal candidates (counted in
        `episodes_env_error` / `episodes_prompt_too_long` and archived with the step); each is
        logged with its cause."""
        played, failed = split_infrastructure_failures(trajectories)
        for t in failed:
            log.warning("step %d: episode %s (task %s) ended with %s (%s); not trained on",
                        step, t.traj_id, t.task.task_id, t.end_reason, t.end_detail or "no detail")
        return played

    # ---- method stages (plain GRPO: no-ops) ------------------------------------------------
    def route(self, trajectories: list[Trajectory], step: int) -> RoutingResult:
        """Step 3 (SMRC-SD and its baselines): references, turn matching, teacher prompts."""
        return self.router(trajectories, step=step) if self.router is not None else RoutingResult()

    def retrieve_skills(self, tasks) -> dict[str, str | None] | None:
        """UniSkill step 1: the skill each task's actor prompts show (None: no skill slot)."""
        return self.skills.retrieve(tasks) if self.skills is not None else None

    def propose_skills(self, trajectories: list[Trajectory], step: int) -> ProposalBatch | None:
        """UniSkill step 4: candidates, proposer prompts, proposals (pre-update weights), critic."""
        return self.skills.propose(trajectories, step=step) if self.skills is not None else None

    def commit_skills(self, proposals: ProposalBatch | None, scores) -> dict[str, float]:
        """UniSkill step 8, after the update: the acceptance rule decides; accepted edits reach the bank."""
        return self.skills.commit(proposals, scores) if proposals is not None and self.skills is not None else {}

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        cfg = self.cfg.run
        first = self.state.step + 1
        if first == 1 and self.cfg.eval.at_start:
            self.evaluate("step_0000")
        with Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.description}"), TimeElapsedColumn(),
                      disable=not cfg.progress) as bar:
            job = bar.add_task("", total=cfg.total_steps, completed=first - 1)
            for step in range(first, cfg.total_steps + 1):
                record = self.train_step(step)
                self.sink.log_step(record)
                bar.update(job, advance=1, description=_summary(record))
                if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.total_steps:
                    self.evaluate(f"step_{step:04d}")
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    self.checkpoint()
        if self.state.step == cfg.total_steps:
            if self.cfg.eval.at_end:
                self.evaluate(f"step_{self.state.step:04d}")
            self.checkpoint()
        self.sink.plot()

    def close(self) -> None:
        """Release what the method stages hold (UniSkill: the skill-bank actor and its server)."""
        if self.skills is not None:
            self.skills.close()

    def evaluate(self, label: str) -> EvalResult:
        result = run_evaluation(self.cluster, self.cfg, label=label, policy_version=self.state.policy_version,
                                skills=self.skills)
        self.sink.log_eval(result, step=self.state.step)
        return result

    def checkpoint(self) -> Path:
        """checkpoints/step_N/{learner/, hf/, router_buffer.jsonl, trainer_state.json}; trainer_state
        is written last (SMRC-SD's success buffer travels with the checkpoint)."""
        ckpt = Path(self.cfg.run.output_dir) / "checkpoints" / f"step_{self.state.step:06d}"
        ckpt.mkdir(parents=True, exist_ok=True)
        self.cluster.save_checkpoint(ckpt / "learner")
        self.cluster.export_hf(ckpt / "hf")
        if self.router is not None:
            self.router.save(ckpt / "router_buffer.jsonl")
        self.state.save(ckpt / "trainer_state.json")
        return ckpt

    def resume(self, ckpt: Path) -> None:
        self.state = TrainerState.load(ckpt / "trainer_state.json")
        self.cluster.load_checkpoint(ckpt / "learner")
        if self.router is not None:
            self.router.load(ckpt / "router_buffer.jsonl")
        self.cluster.sync_weights(self.state.policy_version)


def learner_log_dict(m: StepMetrics) -> dict[str, float]:
    """Flatten the learner's StepMetrics into metrics.jsonl keys (loss/* for loss terms)."""
    out = {"loss/total": m.loss, "loss/pg": m.pg_loss, "loss/kl": m.kl_loss, "loss/entropy": m.entropy_loss,
           **{f"loss/{k}": v for k, v in m.extra_losses.items()}}
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl", "entropy", "grad_norm", "lr",
                "num_rows", "num_tokens", "num_optimizer_steps", "score_mean", "advantage_abs_mean",
                "sampler_logp_abs_diff"):
        out[key] = float(getattr(m, key))
    out.update({f"learner/{k}": v for k, v in m.seconds.model_dump().items()})
    for k, v in m.extra_metrics.items():  # sd_* (SMRC-SD) -> sd/*, prop_* (UniSkill proposer) -> uniskill/*
        out[f"sd/{k.removeprefix('sd_')}" if k.startswith("sd_") else f"uniskill/{k}" if k.startswith("prop_") else k] = v
    return out


def _summary(record: dict) -> str:
    return (f"success {record.get('success_rate', 0):.2f}  loss {record.get('loss/total', 0):+.4f}  "
            f"len {record.get('response_len_mean', 0):.1f}  {record.get('time/rollout_s', 0):.0f}s rollout")
