"""The configuration tree: parsed and validated once at the entry point, saved resolved next to
the run, and sliced per component (each package owns its own slice model). This module assembles
the sections and checks what spans them; deploy/config_loading.py reads files and overrides.

Every model is `extra="forbid"`, so a typo names the offending key. Environment variables carry
deployment facts only (Ray address, Redis URL).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from deploy.config_sections import (
    SKILL_METHOD_SD_FORM,
    EvalConfig,
    FaultsConfig,
    MethodConfig,
    ModelConfig,
    RayConfig,
    RunConfig,
    Section,
    SFTConfig,
    SyncConfig,
)
from deploy.config_uniskill import UniSkillConfig, proposer_loss_settings
from deploy.placement import colocation_errors, derive_sync_method
from envs.config import EnvConfig
from learner.config import LearnerConfig, LoraConfig
from rollout_workers.config import EngineConfig, RolloutConfig
from routing.trackers import MATCHERS_WITHOUT_TRACKER, has_tracker


class TrainConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    uniskill: UniSkillConfig = Field(default_factory=UniSkillConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)

    @model_validator(mode="before")
    @classmethod
    def _derive_learner_slice(cls, data: Any) -> Any:
        """The learner's slice holds no setting of its own that another section already owns:
        learner.proposer's switches follow `uniskill` (VARIANT_SWITCHES) and learner.sd.total_steps
        (the lambda_SD warm-down horizon) is run.total_steps. A hand-set value that disagrees names
        both keys. (Resolved configs of older runs carry learner.proposer.warmup_steps, now decided
        by uniskill.bank.warmup_steps alone, and sd.total_steps 0: both are accepted.)"""
        if not isinstance(data, dict):
            return data
        raw = data.get("uniskill", {})
        try:
            u = raw if isinstance(raw, UniSkillConfig) else UniSkillConfig.model_validate(raw or {})
            run = data.get("run", {})
            run = run if isinstance(run, RunConfig) else RunConfig.model_validate(run or {})
        except ValidationError:
            return data  # field validation reports the error with its key
        learner = data.get("learner", {})
        if isinstance(learner, BaseModel):
            learner = learner.model_dump(exclude_defaults=True)
        proposer = learner.get("proposer", {}) if isinstance(learner, dict) else None
        sd = learner.get("sd", {}) if isinstance(learner, dict) else None
        proposer = proposer.model_dump(exclude_defaults=True) if isinstance(proposer, BaseModel) else proposer
        sd = sd.model_dump(exclude_defaults=True) if isinstance(sd, BaseModel) else sd
        if not isinstance(proposer, dict) or not isinstance(sd, dict):
            return data  # field validation reports the malformed learner section with its key
        derived = proposer_loss_settings(u.enabled, u.variant)
        legacy_warmup = proposer.pop("warmup_steps", u.bank.warmup_steps)
        if legacy_warmup != u.bank.warmup_steps:
            raise ValueError(f"learner.proposer.warmup_steps={legacy_warmup!r} contradicts uniskill.bank.warmup_steps="
                             f"{u.bank.warmup_steps}, which alone sets the warm-up; remove the former")
        for key, value in derived.items():
            if key in proposer and proposer[key] != value:
                raise ValueError(f"learner.proposer.{key}={proposer[key]!r} contradicts the uniskill section "
                                 f"(enabled={u.enabled}, variant={u.variant!r}), which sets it to {value!r}; "
                                 "remove it and set uniskill.*")
        if sd.get("total_steps", 0) not in (0, run.total_steps):
            raise ValueError(f"learner.sd.total_steps={sd['total_steps']!r} contradicts run.total_steps="
                             f"{run.total_steps}, which sets it; remove the former")
        sd = {**sd, "total_steps": run.total_steps}
        method = data.get("method", {})
        method = method.get("name") if isinstance(method, dict) else getattr(method, "name", None)
        if isinstance(method, str) and method in SKILL_METHOD_SD_FORM:
            form = SKILL_METHOD_SD_FORM[method]
            if sd.get("form", form) != form:
                raise ValueError(f"learner.sd.form={sd['form']!r} contradicts method.name={method!r}, which "
                                 f"uses the {form!r} loss; remove learner.sd.form")
            sd["form"] = form
        return {**data, "learner": {**learner, "proposer": {**proposer, **derived}, "sd": sd}}

    @model_validator(mode="before")
    @classmethod
    def _derive_engine_lora(cls, data: Any) -> Any:
        """engine.lora_rank follows learner.lora: the adapter's rank when the adapters travel alone
        (lora.enabled without merge_on_sync), else none. A hand-set value that disagrees names both."""
        if not isinstance(data, dict):
            return data
        learner, engine = data.get("learner", {}), data.get("engine", {})
        if isinstance(learner, BaseModel):
            learner = learner.model_dump()
        if isinstance(engine, BaseModel):
            engine = engine.model_dump(exclude_defaults=True)
        if not isinstance(learner, dict) or not isinstance(engine, dict):
            return data  # field validation reports the malformed section with its key
        try:
            lora = LoraConfig.model_validate(learner.get("lora", {}) or {})
        except ValidationError:
            return data  # field validation reports the error with its key
        rank = lora.rank if lora.enabled and not lora.merge_on_sync else None
        if engine.get("lora_rank", rank) != rank:
            raise ValueError(f"engine.lora_rank={engine['lora_rank']!r} contradicts learner.lora (enabled="
                             f"{lora.enabled}, rank={lora.rank}, merge_on_sync={lora.merge_on_sync}), which sets "
                             f"it to {rank!r}; remove engine.lora_rank")
        return {**data, "engine": {**engine, "lora_rank": rank}}

    @model_validator(mode="after")
    def _uniskill_fits(self) -> TrainConfig:
        """UniSkill with any method is allowed; it needs groups that can hold 2 successes and 2
        failures (when the proposer runs) and proposer prompts that fit the engine."""
        u = self.uniskill
        if not u.enabled:
            return self
        if u.variant == "proposer_only" and self.method.name != "grpo":
            raise ValueError(f"uniskill.variant='proposer_only' trains the proposer alone, but method.name="
                             f"{self.method.name!r} distils the actor; set method.name=grpo")
        if self.rollout.group_size < 4:
            raise ValueError(f"uniskill.variant={u.variant!r} proposes from groups with >= 2 successes and >= 2 "
                             f"failures; rollout.group_size={self.rollout.group_size} can never have them: set >= 4")
        max_len = self.engine.max_model_len
        need = u.proposer.max_prompt_tokens + u.proposer.max_tokens
        if max_len is not None and max_len < need:
            raise ValueError(f"engine.max_model_len={max_len} cannot hold uniskill.proposer.max_prompt_tokens + "
                             f"uniskill.proposer.max_tokens = {need}; raise the former or lower the latter")
        return self

    @model_validator(mode="after")
    def _method_has_a_loss(self) -> TrainConfig:
        if self.method.name != "grpo" and self.learner.sd.coef <= 0:
            raise ValueError(f"method.name={self.method.name!r} distils: set learner.sd.coef > 0 (e.g. 0.1)")
        matcher = self.method.matcher
        if self.method.name != "grpo" and matcher not in MATCHERS_WITHOUT_TRACKER and not has_tracker(self.env.name):
            raise ValueError(f"method.matcher={matcher!r} routes turns by state signatures, and env.name="
                             f"{self.env.name!r} has no state tracker of its own (its plugin's tracker() is None): "
                             f"set method.matcher to {' or '.join(MATCHERS_WITHOUT_TRACKER)} (the generic "
                             "observation-text tracker), or give the environment a tracker")
        return self

    @model_validator(mode="after")
    def _engine_gpus_fit_tensor_parallel(self) -> TrainConfig:
        """A RolloutWorker runs one engine; with tensor parallelism it spans exactly
        engine.tensor_parallel_size whole GPUs (one placement bundle each, `deploy.topology`)."""
        tp, gpus = self.engine.tensor_parallel_size, self.ray.rollout_gpus
        if self.ray.placement == "colocated":  # each rank's share of its GPU (`deploy.placement`)
            gpus = tp if gpus else 0.0
        if tp > 1 and self.engine.engine != "vllm":
            raise ValueError(f"engine.tensor_parallel_size={tp} applies to engine.engine='vllm' only; "
                             f"engine.engine={self.engine.engine!r} runs on one device: set it to 1")
        if tp > 1 and gpus == 0:
            raise ValueError(f"engine.tensor_parallel_size={tp} needs GPUs (one per rank) but ray.rollout_gpus=0; "
                             f"set ray.rollout_gpus={tp}, or tensor_parallel_size=1 on CPU")
        if gpus > 1 or tp > 1:
            if gpus != int(gpus) or int(gpus) % tp:
                raise ValueError(f"ray.rollout_gpus={gpus:g} must be a multiple of engine.tensor_parallel_size={tp} "
                                 f"(each tensor-parallel rank holds a whole GPU): set ray.rollout_gpus={tp}")
            if int(gpus) != tp:
                raise ValueError(f"ray.rollout_gpus={gpus:g} is {int(gpus) // tp} x engine.tensor_parallel_size={tp}, "
                                 "but a RolloutWorker runs one engine, so the extra GPUs would sit idle: set "
                                 f"ray.rollout_gpus={tp} and raise rollout.num_workers to use more GPUs")
        return self

    @model_validator(mode="before")
    @classmethod
    def _colocated_sync_default(cls, data: Any) -> Any:
        """ray.placement=colocated hands the weights over in place unless sync.method says otherwise."""
        return derive_sync_method(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _placement_fits(self) -> TrainConfig:
        """ray.placement's rules (`deploy.placement`): all refusals at once, each naming its fix."""
        errors = colocation_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @model_validator(mode="after")
    def _broadcast_needs_whole_gpus(self) -> TrainConfig:
        """Every member of the weight-sync group needs a GPU of its own: NCCL refuses two ranks of
        one group on one GPU, which fractional ray.rollout_gpus / ray.learner_gpus would produce."""
        if self.sync.method != "broadcast" or self.ray.placement == "colocated":
            return self
        for key in ("rollout_gpus", "learner_gpus"):
            gpus = getattr(self.ray, key)
            if 0 < gpus < 1:
                raise ValueError(f"sync.method=broadcast needs a whole GPU per weight-sync member (NCCL refuses two "
                                 f"ranks on one GPU), but ray.{key}={gpus:g} shares GPUs; set ray.placement=colocated "
                                 "(in-place handover) or sync.method=object_store")
        return self

    @model_validator(mode="after")
    def _pools_hold_a_group(self) -> TrainConfig:
        """Episodes run in waves of whole groups, so each worker's pools must hold one group."""
        r = self.ray
        if self.rollout.num_workers == "auto":  # each worker brings ray.env_pools pools of its own (`deploy.elastic`)
            if self.engine.tensor_parallel_size > 1:
                raise ValueError("rollout.num_workers=auto places one worker and its pools per free slot of a node, "
                                 "which tensor-parallel engines (placement groups) do not support yet; set "
                                 f"rollout.num_workers to a number with engine.tensor_parallel_size="
                                 f"{self.engine.tensor_parallel_size}")
            per_worker = r.env_pools * r.envs_per_pool
        elif r.env_pools < self.rollout.num_workers:
            raise ValueError(f"ray.env_pools={r.env_pools} must be >= rollout.num_workers={self.rollout.num_workers}")
        else:
            per_worker = (r.env_pools // self.rollout.num_workers) * r.envs_per_pool
        max_len = self.engine.max_model_len
        needed = self.rollout.max_prompt_tokens + self.rollout.max_response_tokens
        if max_len is not None and max_len < needed:
            raise ValueError(f"engine.max_model_len={max_len} cannot hold rollout.max_prompt_tokens + "
                             f"rollout.max_response_tokens = {needed}; raise the former or lower the latter")
        largest_group = max(self.rollout.group_size, self.eval.k)
        if per_worker < largest_group:
            raise ValueError(
                f"each rollout worker hosts {per_worker} environments (ray.envs_per_pool x pools per worker) "
                f"but a group needs max(rollout.group_size, eval.k) = {largest_group}; raise ray.envs_per_pool")
        return self
