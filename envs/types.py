"""Contracts produced by `envs` (pydantic v2, frozen, extra="forbid"; stdlib + pydantic only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

EnvName = str
"""A registered environment name (`envs.registry`): the built-in alfworld and webshop, or a plugin's."""
Split = Literal["train", "valid_seen", "valid_unseen"]
SPLITS: tuple[Split, ...] = get_args(Split)
# "ended": the env ended the episode without a win before its step limit (WebShop: a purchase
# scoring below the success threshold); "step_limit": the env's or the rollout's horizon was reached.
EndReason = Literal["won", "ended", "step_limit", "prompt_too_long", "env_error", "running"]
LogValue = str | int | float | bool


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


NAME_CHECKS: list[Callable[[str], None]] = []
"""Checks of `TaskSpec.env` (the environment registry adds one: the name must be registered)."""


class TaskSpec(_Frozen):
    """One task instance. Rollouts that share `(env, split, seed)` start in the same state.

    For the embedded household env the game is regenerated deterministically from
    `(split, seed)` plus the env's difficulty preset, so a TaskSpec is all a worker needs.
    For real game files `task_id` is the game folder relative to the split root.
    """

    env: str = Field(description="the registered environment name (`envs.registry`)")
    task_id: str
    task_type: str
    split: Split
    instruction: str = Field(description="goal sentence, e.g. 'put a clean mug in cabinet.'")
    seed: int

    @field_validator("env")
    @classmethod
    def _registered(cls, env: str) -> str:
        for check in NAME_CHECKS:
            check(env)
        return env


class EnvStep(_Frozen):
    """What one environment returns after reset or step.

    `admissible_actions` is exactly as the engine returns it (ALFWorld: sorted, `help` included;
    prompt rendering drops `help`). `reward` is already scaled (ALFWorld: reward_scale x won).
    `env_error` is set (and done=True) when the environment raised and was recreated; the
    episode must then end with end_reason="env_error".
    """

    observation: str
    admissible_actions: tuple[str, ...]
    reward: float
    done: bool
    won: bool
    truncated: bool = Field(default=False, description="done because the step limit was reached")
    info: dict[str, LogValue] = Field(default_factory=dict)
    env_error: str | None = None


@dataclass(frozen=True)
class TrackedEpisode:
    """One recorded episode as a state tracker reads it.

    `observations[0]` is the reset observation and `observations[t]` follows `actions[t-1]`; it
    holds one more entry than `actions` when the final observation is known. `admissible[t]` lists
    the actions shown with `observations[t]` (one per turn: the final observation's list is not
    recorded). `instruction` is the task's goal sentence."""

    task_id: str
    task_type: str
    instruction: str
    observations: Sequence[str]
    actions: Sequence[str]
    admissible: Sequence[Sequence[str]] = ()


class StateSignature(BaseModel):
    """Discrete, normalised state fields of one turn; hashable.

    `fields` is an ordered tuple of (name, value) pairs. `abstract()` drops ids so that
    signatures from different tasks can be compared.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str
    task_id: str
    fields: tuple[tuple[str, str], ...]

    def abstract(self) -> StateSignature:
        return StateSignature(env=self.env, task_id="*", fields=self.fields)
