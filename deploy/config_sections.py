"""The run's own config sections (run, model, eval, ray, method, sft, faults): each package's slice
lives with its package; these belong to the driver. Assembled into `TrainConfig` in deploy/config.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deploy.laptop.tiny_model import TinyModelConfig


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ModelConfig(Section):
    path: str = "runs/tiny/sft"
    """HF model directory (or hub id on a cluster) the engines and the learner load."""


class RunConfig(Section):
    name: str = "run"
    """Run name (used in logs and the TensorBoard run)."""
    output_dir: str = "runs/default"
    """Directory for config.resolved.json, metrics.jsonl, eval/, checkpoints/, tb/, plots/."""
    seed: int = 0
    """Global seed; task sampling and sampling seeds derive from (seed, step, index)."""
    total_steps: int = 10
    """Training steps (one step = collect, score, update, sync)."""
    eval_every: int = 0
    """Evaluate on the fixed eval set every N steps (0 = only at the end when eval.at_end)."""
    checkpoint_every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """Keep only the newest N complete checkpoints (older ones are deleted after each save; the
    latest complete one never is); None keeps all."""
    progress: bool = True
    """Show a rich progress bar."""
    save_trajectories: bool = True
    """Archive each step's trajectories to trajectories/step_N.jsonl (for `deploy analyze`)."""
    max_restarts: int = Field(3, ge=0)
    """Times the run restarts its learner group from the last checkpoint after a learner rank
    dies, before it gives up; also the restarts Ray grants each rollout worker."""
    loggers: tuple[Literal["tensorboard", "wandb"], ...] = ("tensorboard",)
    """Experiment trackers fed with every step record and evaluation (metrics.jsonl and eval/*.json
    are always written): TensorBoard events in tb/; Weights & Biases (`pip install '.[wandb]'`;
    WANDB_MODE=offline writes RUN/wandb/ without a server) with the resolved config and eval tables."""
    wandb_project: str = "agentrl"
    """Weights & Biases project of the run (with `wandb` in `loggers`); the run is `run.name`."""


FaultComponent = Literal["rollout_worker", "learner", "env_pool", "skillbank_redis", "skillbank_actor", "driver"]


class FaultsConfig(Section):
    """Fault injection, for testing only: kill one component at one training step and let the run
    show it survives (`faults/restarts`, and the run's last line `faults survived: ...`)."""

    enabled: bool = False
    """Must be true for `kill` to be accepted (a guard against a stray override)."""
    kill: FaultComponent | None = None
    """The component to kill: a rollout worker mid-collect, one learner rank's process, an EnvPool
    actor, the skill bank's Redis server, the skill-bank actor, or the driver."""
    at_step: int = Field(1, ge=1)
    """The training step at which the component is killed."""

    @model_validator(mode="after")
    def _guarded(self) -> FaultsConfig:
        if self.kill is not None and not self.enabled:
            raise ValueError(f"faults.kill={self.kill!r} needs faults.enabled=true (fault injection is for testing)")
        if self.enabled and self.kill is None:
            raise ValueError("faults.enabled=true needs faults.kill=<component>: " + ", ".join(FaultComponent.__args__))
        return self


EvalSplit = Literal["train", "valid_seen", "valid_unseen"]


class EvalConfig(Section):
    split: EvalSplit = "valid_unseen"
    """Fixed evaluation split (the only trustworthy success signal; on-policy success is noisy).
    With `splits` set it is the first of them (a single-split config may keep using `split`)."""
    splits: tuple[EvalSplit, ...] | None = None
    """Evaluate each of these splits in one run (e.g. [valid_seen, valid_unseen], as both papers
    report); None = [split]. Each split gets its own eval JSON, TensorBoard tags and plot line."""
    num_tasks: int | None = Field(32, ge=1)
    """Fixed evaluation tasks per split; null or 'all' = the whole split (finite task sets only:
    ALFWorld game files, WebShop goals; generated households have no end)."""
    k: int = 4
    """Samples per task: Avg@k (mean success) and Pass@k are reported."""
    temperature: float = 0.4
    """Sampling temperature at evaluation (verl-agent validation uses 0.4)."""
    at_start: bool = False
    """Evaluate the initial policy before training."""
    at_end: bool = True
    """Evaluate the final policy after training."""

    @model_validator(mode="before")
    @classmethod
    def _splits_and_all(cls, data: Any) -> Any:
        """'all' tasks means the whole split; `split` follows `splits` unless set to one of them."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("num_tasks"), str) and data["num_tasks"].strip().lower() == "all":
            data["num_tasks"] = None
        splits = data.get("splits")
        if isinstance(splits, str):
            # pydantic reports ValueError with the key; a TypeError would escape validation
            raise ValueError(f"eval.splits={splits!r} must be a list, e.g. [valid_seen, valid_unseen]")  # noqa: TRY004
        if isinstance(splits, (list, tuple)) and splits:
            if "split" in data and data["split"] not in splits:
                raise ValueError(f"eval.split={data['split']!r} is not among eval.splits={list(splits)}: "
                                 "remove eval.split (eval.splits alone decides) or list it there")
            data.setdefault("split", splits[0])
        return data

    @model_validator(mode="after")
    def _distinct(self) -> EvalConfig:
        if self.splits is not None and (not self.splits or len(set(self.splits)) != len(self.splits)):
            raise ValueError(f"eval.splits={list(self.splits)} must name at least one split, each once")
        return self

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The splits every evaluation covers, in order."""
        return self.splits or (self.split,)


class RayConfig(Section):
    placement: Literal["disaggregated", "colocated"] = "disaggregated"
    """disaggregated: learner ranks and rollout engines hold devices of their own. colocated: each
    engine rank shares its device (one placement bundle) with one learner rank, and the two take
    turns: engines generate while the learner's state is offloaded, the learner trains while the
    engines sleep, and the new weights hand over in place (sync.method=handover).
    Needs ray.num_learners = rollout.num_workers x engine.tensor_parallel_size, rollout.max_staleness
    0 and a fixed rollout.num_workers (docs/architecture.md "Placement")."""
    address: str | None = None
    """Ray address; None starts (or joins, under `ray job submit`) a local cluster."""
    namespace: str | None = None
    """Ray namespace for named actors (the skill bank "skillbank"); None = the run's `run.name`."""
    num_cpus: int | None = None
    """CPUs for a locally started cluster (None = all)."""
    env_pools: int = 1
    """EnvPool actors (each hosts `envs_per_pool` environments)."""
    envs_per_pool: int = 64
    """Environments per EnvPool actor; must cover tasks_per_step x group_size / env_pools."""
    env_pool_cpus: float = 0.25
    """CPUs reserved per EnvPool actor."""
    rollout_cpus: float = 1.0
    """CPUs per RolloutWorker actor; torch gets round(cpus) threads (1 is fastest for tiny models)."""
    rollout_gpus: float = 0.0
    """GPUs per RolloutWorker actor (tensor_parallel_size on a cluster)."""
    learner_cpus: float = 1.0
    """CPUs per learner rank; torch gets round(cpus) threads unless learner_threads says otherwise."""
    learner_threads: int | None = Field(None, ge=1)
    """Torch threads of each learner rank; None = round(learner_cpus). Ray counts CPUs, it does not
    pin them: a synchronous laptop run (rollout.max_staleness 0) leaves the rollout worker's core
    idle while the learner trains, and learner_threads 2 puts it to work there (about 1.3x faster
    updates of the tiny model on 2 cores). With overlapping phases the threads compete instead."""
    learner_gpus: float = 0.0
    """GPUs per learner rank."""
    num_learners: int = 1
    """DeepSpeed data-parallel ranks (each a Ray actor)."""
    call_timeout_s: float = Field(3600.0, gt=0)
    """Longest wait for one call to the actors (a collection, an update, a weight sync, a restart)
    before the driver stops with an error naming it, instead of hanging."""
    collective_timeout_s: float = Field(1800.0, gt=0)
    """torch.distributed timeout of the learner ranks (rendezvous and every collective): a rank
    whose peer is gone errors out after this."""


SKILL_METHOD_SD_FORM: dict[str, Literal["rkl", "sdar"]] = {"skill_sd": "rkl", "sdar": "sdar"}
"""The skill-teacher baselines and the per-token loss each uses (learner.sd.form, derived from the method)."""


class MethodConfig(Section):
    name: Literal["grpo", "fullpath_sd", "smrc_sd", "routing_only", "context_only", "random_turn",
                  "skill_sd", "sdar"] = "grpo"
    """Which turns get a teacher and what it sees (table in deploy/stages/smrc_sd.py); any method other
    than grpo needs learner.sd.coef > 0. skill_sd and sdar: every turn, the teacher sees a skill
    condensed from earlier experience of the task (routing/skills.py); they set learner.sd.form."""
    matcher: Literal["structured", "history", "observation"] = "structured"
    """Routing matcher (SMRC-SD default: structured state signatures)."""
    candidate: Literal["first_visit", "last_visit", "loop_erased"] = "last_visit"
    """Which reference visit of a matched state the routed position and candidate action come from
    when the reference (one of the policy's own wins) visits that state more than once: the first
    visit after the previous match (its action may start a detour), the last visit (the one the
    reference left for good), or loop_erased (the reference's cycles between repeated states are
    removed before matching, so every routed position is on its final path). Every rule binds the
    candidate to the student's held instance. Default chosen by the rule in docs/testbed.md
    ("SMRC-SD candidate rule"; measured in docs/results.md, "SMRC-SD candidate quality");
    routing.matching.DEFAULT_CANDIDATE is the same value."""
    audit_matchers: tuple[Literal["structured", "history", "observation"], ...] = ("structured", "history")
    """Matchers whose coverage is logged every step (route/coverage_<name>)."""
    context_parts: tuple[Literal["full_reference", "state_summary", "candidate_action"], ...] | None = None
    """Teacher context parts; None = the method's default (ablations: candidate only, summary only).
    Reference methods only: skill_sd and sdar show a skill instead."""

    @model_validator(mode="after")
    def _parts_need_a_reference_method(self) -> MethodConfig:
        if self.context_parts is not None and self.name in SKILL_METHOD_SD_FORM:
            raise ValueError(f"method.context_parts selects parts of a reference block, but method.name="
                             f"{self.name!r} shows the teacher a skill; remove method.context_parts")
        return self
    teacher_max_chars: int = 6000
    """Budget for the reference block in the teacher prompt (oldest steps dropped first)."""


class SFTConfig(Section):
    tiny_model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """Shape of the model `build-tiny-model` creates."""
    num_tasks: int = 300
    """Train-split expert episodes used as demonstrations."""
    epochs: int = 4
    """Passes over the demonstrations (fewer when `max_steps` ends the run first)."""
    max_steps: int | None = Field(None, ge=1)
    """Optimiser steps at most; None = every step of `epochs` passes. The work is counted in steps,
    never in time, so the weights do not depend on the machine's speed or load."""
    minutes: float | None = Field(None, gt=0)
    """Optional wall-clock safety cap, off (None) by default. It never shortens SFT silently: when
    it is reached before the last step, SFT fails and saves nothing (weights cut short by a clock
    would depend on the machine's speed and load)."""
    lr: float = 1e-3
    """AdamW peak learning rate (warm-up 20 steps, cosine to 10%)."""
    batch_rows: int = 32
    """Turns per optimiser step."""
    seed: int = 0
    """Seed for demo task sampling and batching."""
    teacher_fraction: float = Field(0.0, ge=0.0, lt=0.5)
    """Share of all SFT examples that are SMRC-SD teacher-block turns (`deploy.testbed.teacher_data`:
    an expert turn shown with a teacher block routed from another successful trajectory of the same
    task, at matched and unmatched positions); 0 = plain expert turns only."""
    teacher_followed_share: float = Field(0.75, ge=0.0, le=1.0)
    """Of the teacher turns that show a candidate (half of them), the share that are followed turns
    (the candidate is a winning detour, not the expert's action, and it is the target); the rest
    are matched turns whose candidate is the expert's own action (docs/testbed.md)."""
    skill_fraction: float = Field(0.0, ge=0.0, lt=0.5)
    """Share of all SFT examples that are UniSkill skill turns (`deploy.testbed.skill_data`: an expert
    turn with a ground-truth skill in the actor prompt's skill slot, half helpful for the task, half
    about another task type or product category); 0 = none."""
    proposer_fraction: float = Field(0.0, ge=0.0, lt=0.5)
    """Share of all SFT examples that are UniSkill proposer turns (`deploy.testbed.skill_data`: the
    proposer prompt for an expert success and a real failure of one task, target = the right op and a
    ground-truth skill in the bank's valid charset); 0 = none."""

    @model_validator(mode="after")
    def _plain_majority(self) -> SFTConfig:
        fractions = {k: v for k, v in self if k.endswith("_fraction")}
        if sum(fractions.values()) >= 0.5:
            raise ValueError(
                f"sft fractions {fractions} sum to {sum(fractions.values()):g}: plain expert turns must stay the "
                "majority of the SFT examples, so lower them until they sum to < 0.5")
        return self


class SyncConfig(Section):
    """How new weights reach the rollout engines after each update (docs/architecture.md
    "Weight sync")."""

    method: Literal["broadcast", "object_store", "handover"] = "broadcast"
    """broadcast: learner rank 0 streams the tensors in buckets over one extra process group
    (NCCL on GPU, gloo on CPU) straight into each engine, no files, no object store; object_store:
    rank 0 exports safetensors bytes through the Ray object store and each worker reloads them
    from a temporary directory (the fallback, and how a restarted worker always catches up);
    handover (ray.placement=colocated, its default there): each learner rank streams the weights
    to the engine rank on its own device in place, through a ring of two bucket-sized slots shared
    by CUDA IPC on GPU and shared memory on CPU (`weightsync.ipc`), without a process group."""
    bucket_mb: float = Field(256.0, gt=0)
    """Size of one bucket in MiB (a larger tensor travels alone): of a broadcast, and of each of a
    handover's two staging slots; bounds the transient memory on each side."""
    verify: bool = False
    """After every sync, each engine samples a fixed probe and the learner re-scores it: logged as
    sync/probe_max_dlogp and sync/probe_mean_dlogp, with a warning above `verify_tol` (a measurement,
    not a gate; costs one short generate + score per sync). Off by default because every step's
    mismatch/* metrics measure the same gap on the step's own sampled tokens."""
    verify_tol: float | None = Field(None, gt=0)
    """|engine - learner| log-prob above which the probe (`verify`) warns; None: 1e-4 when
    engine.dtype and learner.dtype are both float32,
    else 0.1 (bf16 kernels of the engine and the learner differ by more than fp32 rounding)."""
    timeout_s: float = Field(600.0, gt=0)
    """Bound on the group's rendezvous and on every broadcast: a member that died or stopped
    answering turns into an error naming it after at most this long, never a hang."""
