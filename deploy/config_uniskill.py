"""The `uniskill` config section and what each UniSkill variant switches on (docs/algorithms.md S8)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from deploy.config_sections import Section
from skillbank_service.config import SkillBankConfig

UniSkillVariant = Literal["uniskill", "actor_only", "proposer_only", "no_r_align", "no_support_reg"]


@dataclass(frozen=True)
class VariantSwitches:
    """What a UniSkill variant switches on (docs/algorithms.md S8)."""

    actor_sees_skills: bool
    """The retrieved skill fills the actor's prompt slot (rollouts, R_align's s_orig)."""
    proposer: bool
    """Proposals are generated, judged, scored and committed to the bank."""
    train_proposer: bool
    """The proposer loss (lambda_prop * L_prop) is applied; actor_only keeps the joint procedure and
    the bank-update rule but trains the actor alone."""
    use_r_align: bool
    """r_skill = clip(R_align); false: r_skill from the critic alone (R_align is still computed
    because the bank's acceptance rule needs it)."""
    support_regularizer: bool
    """The proposer's op-support regulariser (c_sup > 0)."""
    train_actor: bool = True
    """The actor's GRPO loss moves the weights; false (proposer_only): the actor's rows are still
    collected, scored and logged, but their loss (policy, KL, entropy) is multiplied by 0, so only
    the proposer's gradient reaches the shared weights."""


VARIANT_SWITCHES: dict[UniSkillVariant, VariantSwitches] = {
    "uniskill": VariantSwitches(True, True, True, True, True),
    "actor_only": VariantSwitches(True, True, False, True, True),
    "proposer_only": VariantSwitches(True, True, True, True, True, train_actor=False),
    "no_r_align": VariantSwitches(True, True, True, False, True),
    "no_support_reg": VariantSwitches(True, True, True, True, False),
}
UNISKILL_OFF = VariantSwitches(False, False, False, False, False)


def proposer_loss_settings(enabled: bool, variant: UniSkillVariant) -> dict[str, object]:
    """The `learner.proposer` fields that follow from the `uniskill` section (derived at load time;
    setting them by hand to something else is an error). `lambda_prop` is not among them: it is the
    proposer loss weight whenever the variant trains the proposer (0.5 in the paper), so every
    variant validates from a config that sets it."""
    sw = VARIANT_SWITCHES[variant]  # "uniskill" whenever UniSkill is off (UniSkillConfig refuses others)
    return {"enabled": enabled and sw.proposer, "train_proposer": sw.train_proposer, "train_actor": sw.train_actor,
            "use_r_align": sw.use_r_align, "support_regularizer": sw.support_regularizer}


class ProposerConfig(Section):
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


class UniSkillConfig(Section):
    """UniSkill (docs/algorithms.md S3-S5, S8): a skill bank, the retrieved skill in the actor prompt and
    the proposer role of the same policy. Combines with any `method` (e.g. smrc_sd)."""

    enabled: bool = False
    """Turn UniSkill on (retrieval, proposals, R_align, bank writes as the variant says)."""
    variant: UniSkillVariant = "uniskill"
    """uniskill = the full method; actor_only = the same joint procedure and bank-update rule but
    only the actor is trained (proposals are still generated, judged, scored and gated; the
    proposer loss is not applied); proposer_only = only the proposer role is trained (the actor
    still acts with retrieved skills, but its GRPO loss contributes no gradient); no_r_align =
    r_skill from the critic alone; no_support_reg = support regulariser off (c_sup 0).
    docs/algorithms.md S8 has the table."""
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
