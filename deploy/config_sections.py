"""The run's own config sections (run, model, eval, ray, method, sft, faults): each package's slice
lives with its package; these belong to the driver. Assembled into `TrainConfig` in deploy/config.py."""

from __future__ import annotations

from typing import Literal

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
    progress: bool = True
    """Show a rich progress bar."""
    save_trajectories: bool = True
    """Archive each step's trajectories to trajectories/step_N.jsonl (for `deploy analyze`)."""
    max_restarts: int = Field(3, ge=0)
    """Times the run restarts its learner group from the last checkpoint after a learner rank
    dies, before it gives up; also the restarts Ray grants each rollout worker."""


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


class EvalConfig(Section):
    split: Literal["train", "valid_seen", "valid_unseen"] = "valid_unseen"
    """Fixed evaluation split (the only trustworthy success signal; on-policy success is noisy)."""
    num_tasks: int = 32
    """Number of fixed evaluation tasks."""
    k: int = 4
    """Samples per task: Avg@k (mean success) and Pass@k are reported."""
    temperature: float = 0.4
    """Sampling temperature at evaluation (verl-agent validation uses 0.4)."""
    at_start: bool = False
    """Evaluate the initial policy before training."""
    at_end: bool = True
    """Evaluate the final policy after training."""


class RayConfig(Section):
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
    """CPUs per learner rank; torch gets round(cpus) threads."""
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


class MethodConfig(Section):
    name: Literal["grpo", "fullpath_sd", "smrc_sd", "routing_only", "context_only", "random_turn"] = "grpo"
    """Which turns get a teacher and what it sees (table in deploy/stages/smrc_sd.py); any method other
    than grpo needs learner.sd.coef > 0."""
    matcher: Literal["structured", "history", "observation"] = "structured"
    """Routing matcher (SMRC-SD default: structured state signatures)."""
    audit_matchers: tuple[Literal["structured", "history", "observation"], ...] = ("structured", "history")
    """Matchers whose coverage is logged every step (route/coverage_<name>)."""
    context_parts: tuple[Literal["full_reference", "state_summary", "candidate_action"], ...] | None = None
    """Teacher context parts; None = the method's default (ablations: candidate only, summary only)."""
    teacher_max_chars: int = 6000
    """Budget for the reference block in the teacher prompt (oldest steps dropped first)."""


class SFTConfig(Section):
    tiny_model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """Shape of the model `build-tiny-model` creates."""
    num_tasks: int = 300
    """Train-split expert episodes used as demonstrations."""
    epochs: int = 4
    """Passes over the demonstrations (capped by `minutes`)."""
    minutes: float = 6.0
    """Wall-clock budget for SFT."""
    lr: float = 1e-3
    """AdamW peak learning rate (warm-up 20 steps, cosine to 10%)."""
    batch_rows: int = 32
    """Turns per optimiser step."""
    seed: int = 0
    """Seed for demo task sampling and batching."""
