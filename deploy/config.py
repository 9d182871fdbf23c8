"""The configuration tree: parsed and validated once at the entry point, saved resolved next to
the run, and sliced per component (each package owns its own slice model).

YAML file + dotted `--set key=value` overrides; every model is `extra="forbid"`, so a typo names
the offending key. Environment variables carry deployment facts only (Ray address, Redis URL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deploy.laptop.tiny_model import TinyModelConfig
from envs.config import EnvConfig
from learner.config import LearnerConfig
from rollout_workers.config import EngineConfig, RolloutConfig
from routing.trackers import TRACKERS
from skillbank_service.config import SkillBankConfig


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ModelConfig(_Section):
    path: str = "runs/tiny/sft"
    """HF model directory (or hub id on a cluster) the engines and the learner load."""


class RunConfig(_Section):
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


class FaultsConfig(_Section):
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


class EvalConfig(_Section):
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


class RayConfig(_Section):
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


class MethodConfig(_Section):
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


class SFTConfig(_Section):
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


UniSkillVariant = Literal["uniskill", "actor_only", "proposer_only", "no_r_align", "no_support_reg"]


@dataclass(frozen=True)
class VariantSwitches:
    """What a UniSkill variant switches on (docs/algorithms.md S8)."""

    actor_sees_skills: bool
    """The retrieved skill fills the actor's prompt slot (rollouts, R_align's s_orig)."""
    proposer: bool
    """Proposals are generated, judged, scored and committed to the bank."""
    train_proposer: bool
    """The proposer loss is trained (lambda_prop > 0); actor_only keeps the joint procedure and
    the bank-update rule but trains the actor alone."""
    use_r_align: bool
    """r_skill = clip(R_align); false: r_skill from the critic alone (R_align is still computed
    because the bank's acceptance rule needs it)."""
    support_regularizer: bool
    """The proposer's op-support regulariser (c_sup > 0)."""


VARIANT_SWITCHES: dict[UniSkillVariant, VariantSwitches] = {
    "uniskill": VariantSwitches(True, True, True, True, True),
    "actor_only": VariantSwitches(True, True, False, True, True),
    "proposer_only": VariantSwitches(False, True, True, True, True),
    "no_r_align": VariantSwitches(True, True, True, False, True),
    "no_support_reg": VariantSwitches(True, True, True, True, False),
}
UNISKILL_OFF = VariantSwitches(False, False, False, False, False)


def proposer_loss_settings(enabled: bool, variant: UniSkillVariant) -> dict[str, object]:
    """The `learner.proposer` fields that follow from the `uniskill` section (derived at load time;
    setting them by hand to something else is an error)."""
    sw = VARIANT_SWITCHES[variant]
    return {"enabled": enabled and sw.proposer, "lambda_prop": 0.5 if sw.train_proposer else 0.0,
            "use_r_align": sw.use_r_align, "support_regularizer": sw.support_regularizer}


class ProposerConfig(_Section):
    """UniSkill's proposer role: generation settings and the prompt budget."""

    max_tokens: int = Field(default=256, ge=1)
    """Tokens generated per proposal (op token + skill text)."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature of proposals (unconstrained; top_p 1 so the learner's logprobs match)."""
    max_prompt_tokens: int = Field(default=4096, ge=1)
    """Proposer prompts longer than this are dropped (counted in uniskill/prompts_too_long)."""
    trajectory_max_chars: int = Field(default=3000, ge=200)
    """Character budget per trajectory shown in the prompt (oldest steps dropped first)."""
    constrain_op: bool = False
    """Decode the op in two engine calls: first constrained to the legal "<OP></action>" strings,
    then the skill text unconstrained from there (all tokens are still the engine's samples). Off
    = the paper's free generation (format learned through r_fmt); on = for small or untrained
    models that cannot yet emit the format (the laptop smoke configs)."""


class UniSkillConfig(_Section):
    """UniSkill (docs/algorithms.md S3-S5, S8): a skill bank, the retrieved skill in the actor prompt and
    the proposer role of the same policy. Combines with any `method` (e.g. smrc_sd)."""

    enabled: bool = False
    """Turn UniSkill on (retrieval, proposals, R_align, bank writes as the variant says)."""
    variant: UniSkillVariant = "uniskill"
    """uniskill = the full method; actor_only = the same joint procedure and bank-update rule but
    only the actor is trained (lambda_prop 0: proposals are still generated, judged, scored and
    gated); proposer_only = proposer trained, the actor never sees skills; no_r_align = r_skill from
    the critic alone; no_support_reg = support regulariser off (c_sup 0)."""
    detached: bool = False
    """Keep the "skillbank" actor (and its private Redis server) alive after the run, for
    inspection with `python -m deploy skills ...`; stop it later with `ray.kill`. Off: the run
    stops it (and its server) when training ends."""
    retrieval_at_eval: bool = True
    """Show retrieved skills at evaluation (false = the paper's retrieval-off analysis)."""
    max_candidates_per_step: int = Field(default=32, ge=1)
    """Proposals per step at most (a uniform sample of the eligible sources)."""
    proposer: ProposerConfig = Field(default_factory=ProposerConfig)
    bank: SkillBankConfig = Field(default_factory=SkillBankConfig)
    """The skill bank, retrieval (top_k), warm-up steps and the critic (skillbank_service.config)."""

    @model_validator(mode="after")
    def _check(self) -> UniSkillConfig:
        if not self.enabled and self.variant != "uniskill":
            raise ValueError(f"uniskill.variant={self.variant!r} has no effect while uniskill.enabled=false; "
                             "set uniskill.enabled=true")
        if self.bank.top_k != 1:
            raise ValueError(f"uniskill.bank.top_k={self.bank.top_k}: the actor's skill slot and UPDATE take "
                             "exactly one retrieved skill; set it to 1")
        return self


class TrainConfig(_Section):
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
        return {**data, "learner": {**learner, "proposer": {**proposer, **derived}, "sd": sd}}

    @model_validator(mode="after")
    def _uniskill_fits(self) -> TrainConfig:
        """UniSkill with any method is allowed; it needs groups that can hold 2 successes and 2
        failures (when the proposer runs) and proposer prompts that fit the engine."""
        u = self.uniskill
        if not u.enabled:
            return self
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
        if self.method.name != "grpo" and self.env.name not in TRACKERS:
            raise ValueError(f"method.name={self.method.name!r} routes turns by state, and env.name={self.env.name!r} "
                             f"has no state tracker (routing.trackers knows {', '.join(sorted(TRACKERS))})")
        return self

    @model_validator(mode="after")
    def _pools_hold_a_group(self) -> TrainConfig:
        """Episodes run in waves of whole groups, so each worker's pools must hold one group."""
        r = self.ray
        if r.env_pools < self.rollout.num_workers:
            raise ValueError(f"ray.env_pools={r.env_pools} must be >= rollout.num_workers={self.rollout.num_workers}")
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


class ConfigError(ValueError):
    """A configuration problem, phrased so the user knows which key to fix."""


def _parse_value(text: str, key: str = "") -> Any:
    """YAML scalar/list parsing, plus floats YAML 1.1 leaves as strings (`3e-5`)."""
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"override {key}={text!r}: the value is not valid YAML ({reason}); wrap it in "
                          "quotes to pass it as text") from None
    if isinstance(value, str):
        try:
            return float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    return value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides (values parsed as YAML scalars/lists) to a nested dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_value(raw, key.strip())
    return tree


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (typo? see `python -m deploy validate-config --help`)")
        else:
            lines.append(f"  {key}: {e['msg']}")
    return "\n".join(lines)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file as a dict. YAML files may start from another with `base: other.yaml`
    (relative to the file); keys given here override the base's, section by section."""
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as err:
        raise ConfigError(f"config file {str(path)!r} is not a usable path ({err})") from None
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if p in _seen:
        raise ConfigError(f"config {p} includes itself through 'base'")
    try:
        text = p.read_text()
        tree = (json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)) or {}
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as err:  # JSON and UTF-8 errors are ValueErrors
        raise ConfigError(f"config {p} cannot be parsed: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config {p} must be a mapping at the top level")
    base = tree.pop("base", None)
    if base and not isinstance(base, str):
        raise ConfigError(f"config {p}: 'base' must name another config file, got {base!r}")
    return _deep_merge(read_tree(p.parent / base, (*_seen, p)), tree) if base else tree


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML (or a saved config.resolved.json), apply overrides, validate."""
    tree = read_tree(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    tree = apply_overrides(tree, overrides or [])
    try:
        cfg = TrainConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
    data_path = cfg.env.data_path
    if data_path is not None:
        try:
            expanded = Path(data_path).expanduser()
            resolved = None if expanded.is_absolute() else str(expanded.resolve())
        except (OSError, RuntimeError, ValueError) as err:  # "~unknown_user", a NUL byte, a link loop
            raise ConfigError(f"env.data_path={data_path!r} is not a usable path ({err})") from None
        if resolved is not None:
            # Actors (and `ray job submit` jobs, whose working dir leaves runs/ out) must see the same
            # folder the driver meant: resolve against the driver's working directory once, here.
            cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"data_path": resolved})})
    return cfg


def save_resolved(cfg: TrainConfig, run_dir: str | Path) -> Path:
    out = Path(run_dir) / "config.resolved.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Derived fields stay out, so a resumed run with another run.total_steps derives them afresh.
    out.write_text(cfg.model_dump_json(indent=2, exclude={"learner": {"sd": {"total_steps"}}}))
    return out


def resolve_model_path(path: str) -> str:
    """The model every actor will load, checked on the driver before any actor starts: an existing
    directory (made absolute, so actors and `ray job submit` jobs see the folder the driver meant)
    or a hub id already in the local Hugging Face cache. Anything else is a ConfigError that names
    the path and the fix, instead of the hub's "Repo id must be in the form ..." from inside an actor."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path {path!r} is a directory without config.json: point it at a "
                              "Hugging Face model directory")
        return str(local.resolve())
    if local.exists():
        raise ConfigError(f"model.path {path!r} is a file; it must be a Hugging Face model directory")
    if _in_hf_cache(path):
        return path
    raise ConfigError(
        f"model.path {path!r} is neither a directory nor a model in the local Hugging Face cache. "
        "Build the laptop model with `python -m deploy build-tiny-model --out runs/tiny/base` (then "
        "`python -m deploy sft` for runs/tiny/sft), download the model first "
        "(`huggingface-cli download <org/name>`), or set --set model.path=<HF model directory>")


def _in_hf_cache(repo_id: str) -> bool:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError:
        return False

