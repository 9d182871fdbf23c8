"""The synchronous training loop (docs/architecture.md "one training step"). Each stage is a named call;
UniSkill retrieval (step 1), SMRC-SD routing (step 3), UniSkill proposals (step 4) and the
skill-bank commit (step 8, after the update) are stages that are no-ops for plain GRPO.

A learner group that loses a rank is replaced and the run continues from the last checkpoint
(`Trainer.restart_learners`); the fault injector (`deploy.faults`) sees every stage start.
"""

from __future__ import annotations

import json
import logging
import math
import time
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from deploy.cluster import Cluster
from deploy.config import TrainConfig
from deploy.elastic import ElasticRollout
from deploy.evaluation import EvalResult, summarize_eval
from deploy.faults import FaultInjector
from deploy.metrics import MetricsSink, rollout_metrics
from deploy.pipeline import Collected, RolloutPipeline, check_staleness, may_prefetch
from deploy.recovery import LearnerGroupFailed, Recovery
from deploy.stages.smrc_sd import RoutingResult, TeacherRouter
from deploy.stages.uniskill import ProposalBatch, UniSkillStage
from deploy.step_rows import StepRows
from envs.tasks import eval_tasks, sample_tasks, task_list
from learner.batch import rows_from_trajectories
from learner.checkpoint import prune_checkpoints
from learner.types import StepMetrics
from rollout_workers.types import AnyTrajectory, Trajectory, split_infrastructure_failures

log = logging.getLogger(__name__)


def step_seed(run_seed: int, step: int) -> int:
    """Per-step seed derived from (run seed, step): resuming reproduces the same task stream."""
    return zlib.crc32(f"{run_seed}:{step}".encode())


@dataclass
class StageTimer:
    seconds: dict[str, float] = field(default_factory=dict)
    on_enter: Callable[[str], None] | None = None
    """Called with the stage's name as it starts (the fault injector)."""

    @contextmanager
    def __call__(self, stage: str):
        if self.on_enter is not None:
            self.on_enter(stage)
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


def rewind_metrics(path: Path, last_step: int) -> int:
    """Drop the metrics.jsonl lines of steps after `last_step` (they are about to be replayed);
    returns how many were dropped."""
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= last_step]
    if len(kept) != len(lines):
        path.write_text("".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def make_router(cfg: TrainConfig) -> TeacherRouter | None:
    """The routing stage of a distilling method (None for plain GRPO)."""
    if cfg.method.name == "grpo":
        return None
    from transformers import AutoTokenizer

    m = cfg.method
    return TeacherRouter(
        method=m.name, matcher=m.matcher, parts=frozenset(m.context_parts) if m.context_parts is not None else None,
        audit_matchers=m.audit_matchers, rollout=cfg.rollout, tokenizer=AutoTokenizer.from_pretrained(cfg.model.path),
        max_chars=m.teacher_max_chars, seed=cfg.run.seed, candidate=m.candidate)


def make_skill_stage(cfg: TrainConfig, cluster: Cluster) -> UniSkillStage | None:
    """UniSkill's stage (None unless uniskill.enabled): the run's skill-bank actor, the critic and
    proposal generation on the rollout workers."""
    if not cfg.uniskill.enabled:
        return None
    from deploy.stages.uniskill import make_stage

    return make_stage(cfg, cluster)


def run_evaluation(cluster: Cluster, cfg: TrainConfig, *, label: str, policy_version: int,
                   skills: UniSkillStage | None = None, split: str | None = None) -> EvalResult:
    """Avg@k / Pass@k on the fixed evaluation set of one split (`split`, default `eval.split`; same
    tasks every call); with UniSkill the actor sees retrieved skills unless
    `uniskill.retrieval_at_eval` is off."""
    from rich.console import Console

    split = split or cfg.eval.split
    n = cfg.eval.num_tasks  # None = the whole split (a finite task set)
    tasks = eval_tasks(cfg.env, split, n) if n is not None else task_list(cfg.env, split)
    shown = skills.retrieve(tasks, evaluation=True) if skills is not None else None
    with Console(stderr=True).status(f"evaluating {label}: {len(tasks)} {split} tasks x {cfg.eval.k} samples"):
        trajs, _ = cluster.collect(tasks, group_size=cfg.eval.k, policy_version=policy_version,
                                   temperature=cfg.eval.temperature, skill_texts=shown, tokens=False)
    return summarize_eval(trajs, label=label, split=split, k=cfg.eval.k,
                          temperature=cfg.eval.temperature)


def run_evaluations(cluster: Cluster, cfg: TrainConfig, *, label: str, policy_version: int,
                    skills: UniSkillStage | None = None) -> list[EvalResult]:
    """One evaluation per split of `eval.eval_splits`. With several splits each result's label
    carries its split (`step_0010-valid_seen`), so each gets its own eval/<label>.json."""
    splits = cfg.eval.eval_splits
    return [run_evaluation(cluster, cfg, label=label if len(splits) == 1 else f"{label}-{split}",
                           policy_version=policy_version, skills=skills, split=split) for split in splits]


class Trainer:
    def __init__(self, cfg: TrainConfig, cluster: Cluster, sink: MetricsSink, state: TrainerState):
        self.cfg, self.cluster, self.sink, self.state = cfg, cluster, sink, state
        self.router = make_router(cfg)
        self.skills = make_skill_stage(cfg, cluster)
        self.faults = FaultInjector(cfg)
        self.faults.bind(cluster, bank=self._bank_handle, checkpoint=self.checkpoint,
                         has_checkpoint=lambda step: self._checkpoint_dir(step).joinpath("trainer_state.json").exists())
        self.learner_restarts = 0
        self._current = 0  # the step being trained, evaluated or checkpointed
        self.pipeline = RolloutPipeline(cluster, cfg.rollout.max_staleness)
        self.elastic = ElasticRollout(cfg, cluster)  # rollout.num_workers=auto: workers join/leave between steps

    # ---- one step, as a table of contents -------------------------------------------------
    def train_step(self, step: int) -> dict[str, float | int]:
        begin = time.perf_counter()
        timer = StageTimer(on_enter=lambda stage: self.faults.stage(stage, step))
        prefetched = self.pipeline.in_flight_step == step  # submitted during the step before (K >= 1)
        job = None if prefetched else self.prepare_rollout(step, timer)
        with timer("rollout"):
            self.cluster.phases.generate()  # colocated: the engines hold the devices (no-op otherwise)
            if job is not None:
                self.pipeline.submit(step, **job)
            batch = self.pipeline.take(step, prefetched=prefetched)
        trajs, rstats = batch.trajectories, batch.stats
        played = self.exclude_infrastructure_failures(trajs, step)
        with timer("route"):
            routed = self.route(played, step)
        with timer("propose"):
            proposals = self.propose_skills(played, step)
        if self._may_prefetch(step):  # step k+1's rollout runs while step k trains (rollout.max_staleness)
            job = self.prepare_rollout(step + 1, StageTimer(on_enter=lambda stage: self.faults.stage(stage, step + 1)))
            self.faults.stage("rollout", step + 1)
            self.pipeline.submit(step + 1, **job)
        rows = self.training_data(batch, played, routed, step)  # by reference: the learners build the rows
        learn: dict[str, float] = {}
        scores: list = []
        stale = check_staleness(played, self.state.policy_version, self.cfg.rollout.max_staleness, step)
        sync_wait = 0.0
        if rows:  # every episode can end before its first turn (env errors): then no update
            prop_rows, align = self.skills.learner_inputs(proposals, self.driver_rows(batch.with_tokens(played), routed)) \
                if proposals else ([], [])
            with timer("learn"):
                self.cluster.phases.train()  # colocated: engines asleep, the learner's state back on the devices
                metrics = self.cluster.train(rows, prop_rows, align,
                                             proposer_warmup=proposals is not None and proposals.warmup)
                learn, scores = learner_log_dict(metrics), metrics.proposal_scores
            with timer("sync"):
                sync_wait = self.pipeline.wait_engines()  # the next step's rollout finishes generating first
                self.state.policy_version += 1
                self.cluster.sync_weights(self.state.policy_version)
            learn.update({f"sync/{k}": v for k, v in self.cluster.last_sync.items() if k != "seconds"})
        with timer("skill_commit"):
            committed = self.commit_skills(proposals, scores)
        self.sink.save_proposals(step, proposals.records if proposals is not None else [])
        self.state.step = step
        return {"step": step, "policy_version": self.state.policy_version,
                **rollout_metrics(trajs), **routed.metrics, **learn, **committed, **batch.extra,
                "rollout/generate_s": rstats.generate_s, "rollout/env_s": rstats.env_s,
                **batch.seconds, **timer.seconds, **self.faults.step_metrics(step), **self.cluster.phases.step_metrics(),
                "async/staleness_mean": stale[0], "async/staleness_max": float(stale[1]),
                "async/learner_wait_s": batch.wait_s, "async/sync_wait_s": sync_wait,
                "time/step_s": time.perf_counter() - begin}

    def prepare_rollout(self, step: int, timer: StageTimer) -> dict:
        """Sample step's tasks and retrieve their skills (UniSkill: the bank as of the last commit,
        that of step `self.state.step`): the arguments of `RolloutPipeline.submit`."""
        with timer("sample"):
            tasks = sample_tasks(self.cfg.env, "train", self.cfg.rollout.tasks_per_step,
                                 step_seed(self.cfg.run.seed, step))
        with timer("retrieve"):
            shown = self.retrieve_skills(tasks)
        extra = {"uniskill/bank_commit_seen": float(self.state.step)} if self.skills is not None else {}
        return {"tasks": tasks, "group_size": self.cfg.rollout.group_size, "policy_version": self.state.policy_version,
                "temperature": self.cfg.rollout.temperature, "skill_texts": shown, "seconds": timer.seconds,
                "extra": extra}

    def training_data(self, batch: Collected, played: list[AnyTrajectory], routed: RoutingResult,
                      step: int) -> StepRows | list:
        """What the learners train on: the step's trajectories by reference (each rank fetches
        them and builds the rows, `deploy.step_rows`; rank 0 archives them), or rows built here when
        the collector keeps no refs. Empty (falsy) when no played episode has a turn to learn from;
        the step's archive is then written here."""
        archive = self.sink.trajectories_path(step) if self.cfg.run.save_trajectories else None
        if not any(turn.num_response_tokens for t in played for turn in t.turns):
            if archive is not None:
                self.sink.save_trajectories(step, batch.with_tokens(batch.trajectories))
            return []
        if not batch.refs:
            if archive is not None:
                self.sink.save_trajectories(step, batch.trajectories)
            return self.driver_rows(played, routed)
        return StepRows.of(batch.refs, played, routed.teacher_messages, gamma=self.cfg.learner.gigpo_gamma,
                           archive=archive)

    def driver_rows(self, played: list[Trajectory], routed: RoutingResult) -> list:
        """The step's rows built on the driver from whole trajectories (UniSkill's R_align requests
        read them; the only stage that fetches the step's token arrays to the driver)."""
        return rows_from_trajectories(played, routed.teacher_prompts or None, gamma=self.cfg.learner.gigpo_gamma)

    def _may_prefetch(self, step: int) -> bool:
        run = self.cfg.run
        return may_prefetch(step, max_staleness=self.cfg.rollout.max_staleness, total_steps=run.total_steps,
                            eval_every=run.eval_every, checkpoint_every=run.checkpoint_every)

    @staticmethod
    def exclude_infrastructure_failures(trajectories: list[AnyTrajectory], step: int) -> list[AnyTrajectory]:
        """Episodes the env crashed under or whose prompt outgrew the budget say nothing about the
        policy: they leave the groups, the references and the proposal candidates (counted in
        `episodes_env_error` / `episodes_prompt_too_long` and archived with the step); each is
        logged with its cause."""
        played, failed = split_infrastructure_failures(trajectories)
        for t in failed:
            log.warning("step %d: episode %s (task %s) ended with %s (%s); not trained on",
                        step, t.traj_id, t.task.task_id, t.end_reason, t.end_detail or "no detail")
        return played

    def _bank_handle(self):
        """The skill-bank actor (None without UniSkill), for the fault injector."""
        return getattr(getattr(self.skills, "bank", None), "handle", None)

    # ---- method stages (plain GRPO: no-ops) ------------------------------------------------
    def route(self, trajectories: list[AnyTrajectory], step: int) -> RoutingResult:
        """Step 3 (SMRC-SD and its baselines): references, turn matching, teacher prompts."""
        return self.router(trajectories, step=step) if self.router is not None else RoutingResult()

    def retrieve_skills(self, tasks) -> dict[str, str | None] | None:
        """UniSkill step 1: the skill each task's actor prompts show (None: no skill slot)."""
        return self.skills.retrieve(tasks) if self.skills is not None else None

    def propose_skills(self, trajectories: list[AnyTrajectory], step: int) -> ProposalBatch | None:
        """UniSkill step 4: candidates, proposer prompts, proposals (pre-update weights), critic."""
        return self.skills.propose(trajectories, step=step) if self.skills is not None else None

    def commit_skills(self, proposals: ProposalBatch | None, scores) -> dict[str, float]:
        """UniSkill step 8, after the update: the acceptance rule decides; accepted edits reach the bank."""
        return self.skills.commit(proposals, scores) if proposals is not None and self.skills is not None else {}

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        from deploy.progress import StepProgress, step_summary

        cfg = self.cfg.run
        if self.state.step == 0 and self.cfg.eval.at_start:
            self.evaluate("step_0000")
        with StepProgress("train", cfg.total_steps, self.state.step, enabled=cfg.progress) as progress:
            while True:
                try:
                    self._train_steps(lambda record: progress.advance(step_summary(record)))
                    self._finish()
                    break
                except LearnerGroupFailed as err:
                    self._restart_until_up(err)
                    progress.completed(self.state.step)
        self.sink.plot()

    def _train_steps(self, progress: Callable[[dict], None]) -> None:
        cfg = self.cfg.run
        for step in range(self.state.step + 1, cfg.total_steps + 1):
            self._current = step
            record = {**self.elastic.rescale(step), **self.train_step(step)}  # rescale first: between steps
            self.sink.log_step(record)
            progress(record)
            if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.total_steps:
                self.evaluate(f"step_{step:04d}")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self.checkpoint()

    def _finish(self) -> None:
        """After the last step: evaluate (eval.at_end) and checkpoint."""
        if self.state.step == self.cfg.run.total_steps:
            self._current = self.state.step
            if self.cfg.eval.at_end:
                self.evaluate(f"step_{self.state.step:04d}")
            self.checkpoint()

    def _restart_until_up(self, err: LearnerGroupFailed) -> None:
        while True:
            try:
                self.restart_learners(err)
                return
            except LearnerGroupFailed as again:  # the new group failed too: counts as another restart
                err = again

    def restart_learners(self, err: LearnerGroupFailed) -> None:
        """A learner rank died or stopped answering during step `self._current`: replace the whole
        group (a data-parallel group cannot continue without a rank) from the latest complete
        checkpoint, or from the run's initial model when there is none, rewind the driver's state
        (step, policy version, SMRC-SD buffer, metrics.jsonl) to it and push its weights to the
        engines; the loop then replays the steps after it with the same task stream (tasks and
        sampling seeds derive from step and version). Raises after run.max_restarts restarts."""
        failed, limit = self._current, self.cfg.run.max_restarts
        self.learner_restarts += 1
        if self.learner_restarts > limit:
            raise RuntimeError(f"the learner group failed at step {failed} and run.max_restarts={limit} "
                               f"restart(s) are used up: {err}") from err
        ckpt = latest_checkpoint(self.cfg.run.output_dir)
        log.warning("step %d: %s; restarting the learner group from %s (restart %d of at most %d)",
                    failed, err, ckpt or "the initial model", self.learner_restarts, limit)
        start = time.perf_counter()
        dropped = self.pipeline.discard()  # the replay re-collects it
        if dropped is not None:
            log.warning("dropped the in-flight rollout of step %d; it is collected again in the replay", dropped)
        self.cluster.restart_learners()
        if ckpt is not None:
            self.resume(ckpt)
        else:  # back to the run's start: the new group holds the initial model
            self.state, self.router = TrainerState(), make_router(self.cfg)
            rewind_metrics(self.sink.metrics_path, 0)
            self.cluster.sync_weights(0)
        self.faults.log.add(failed, [Recovery(
            "learner", f"learner group of {self.cfg.ray.num_learners} rank(s)", time.perf_counter() - start,
            {"replayed_steps": float(failed - 1 - self.state.step), "restored_step": float(self.state.step)})])

    def close(self) -> None:
        """Drain the in-flight rollout (K >= 1) and release what the method stages hold (UniSkill:
        the skill-bank actor and its server)."""
        self.pipeline.discard()
        if self.skills is not None:
            self.skills.close()

    def evaluate(self, label: str) -> list[EvalResult]:
        """Evaluate on every split of `eval.eval_splits` and log each result (after the in-flight
        rollout, if any, has finished: none is at a scheduled evaluation, `deploy.pipeline.may_prefetch`)."""
        self.pipeline.wait_engines()
        self.cluster.phases.generate()
        results = run_evaluations(self.cluster, self.cfg, label=label, policy_version=self.state.policy_version,
                                  skills=self.skills)
        for result in results:
            self.sink.log_eval(result, step=self.state.step)
        return results

    def _checkpoint_dir(self, step: int) -> Path:
        return Path(self.cfg.run.output_dir) / "checkpoints" / f"step_{step:06d}"

    def checkpoint(self) -> Path:
        """checkpoints/step_N/{learner/, hf/, router_buffer.jsonl, trainer_state.json} (with LoRA also
        adapter/, a peft adapter directory, and hf/ the merged model unless lora.export_merged is
        off); trainer_state is written last (SMRC-SD's success buffer travels with the checkpoint). A rollout in flight
        (only at an unscheduled checkpoint: the fault injector's) is drained, not saved: a resumed
        run collects that step again."""
        self.pipeline.wait_engines()
        ckpt = self._checkpoint_dir(self.state.step)
        ckpt.mkdir(parents=True, exist_ok=True)
        self.cluster.phases.train(handover_follows=False)  # colocated: the learner's state is saved from its device
        self.cluster.save_checkpoint(ckpt / "learner")
        lora = self.cfg.learner.lora
        if lora.enabled:  # the peft adapter directory, and the merged model unless export_merged is off
            self.cluster.export_hf(ckpt / "adapter", adapter=True)
        if not lora.enabled or lora.export_merged:
            self.cluster.export_hf(ckpt / "hf")
        if self.router is not None:
            self.router.save(ckpt / "router_buffer.jsonl")
        self.state.save(ckpt / "trainer_state.json")
        if self.cfg.run.keep_checkpoints is not None:
            prune_checkpoints(ckpt.parent, self.cfg.run.keep_checkpoints)
        return ckpt

    def resume(self, ckpt: Path) -> None:
        """Continue from `ckpt`: the steps logged after it are dropped from metrics.jsonl and replayed."""
        self.pipeline.discard()
        self.state = TrainerState.load(ckpt / "trainer_state.json")
        self.cluster.phases.train()
        self.cluster.load_checkpoint(ckpt / "learner")
        if self.router is not None:
            self.router.load(ckpt / "router_buffer.jsonl")
        rewind_metrics(self.sink.metrics_path, self.state.step)
        self.cluster.sync_weights(self.state.policy_version)


def learner_log_dict(m: StepMetrics) -> dict[str, float]:
    """Flatten the learner's StepMetrics into metrics.jsonl keys (loss/* for loss terms)."""
    out = {"loss/total": m.loss, "loss/pg": m.pg_loss, "loss/kl": m.kl_loss, "loss/entropy": m.entropy_loss,
           **{f"loss/{k}": v for k, v in m.extra_losses.items()}}
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl", "entropy", "grad_norm", "lr",
                "num_rows", "num_tokens", "num_optimizer_steps", "score_mean", "advantage_abs_mean",
                "sampler_logp_abs_diff"):
        if key == "entropy" and math.isnan(m.entropy):
            continue  # learner.log_entropy is off: not measured, so absent (metrics.jsonl stays strict JSON)
        out[key] = float(getattr(m, key))
    out.update({f"learner/{k}": v for k, v in m.seconds.model_dump().items()})
    for k, v in m.extra_metrics.items():  # sd_* (SMRC-SD) -> sd/*, prop_* (UniSkill proposer) -> uniskill/*
        out[f"sd/{k.removeprefix('sd_')}" if k.startswith("sd_") else f"uniskill/{k}" if k.startswith("prop_") else k] = v
    return out
