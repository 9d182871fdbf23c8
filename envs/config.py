"""Environment configuration (the `env:` section of a run config)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs import registry
from envs.household.difficulty import PRESETS, Difficulty, PresetName, TaskType


class EnvConfig(BaseModel):
    """Which environment, which engine, how hard, and the episode rules.

`name` is a registered environment (`envs.registry`; the built-in alfworld and webshop) or the
name of the plugin `plugin` loads; `options` reaches that environment as is. The alfworld and
webshop knobs below are the built-in environments' own (a plugin reads its knobs from `options`).

    Difficulty = the preset, with each explicitly set knob overriding it (`difficulty()`).
    Presets: easy (laptop demo: pick_and_place_simple, look_at_obj_in_light,
    pick_clean_then_place_in_recep; 4-7 receptacles; at most 2 start closed; 1-4 distractors),
    standard (all six types; 5-12 receptacles, all openable ones closed; 2-6 distractors),
    hard (all six types; 8-15 receptacles, all closed; 4-10 distractors).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str = "alfworld"
    """A registered environment name (built-in: alfworld, webshop); TaskSpec.env of every task.
    Defaults to the plugin's name when `plugin` is given."""
    plugin: str | None = None
    """An environment from any installed package, as "package.module:Factory" (a class or callable
    returning an `envs.api.EnvPlugin`); None = `name` as registered (built-in or entry point)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The environment's own options, passed to its plugin as they are (`cfg.options`)."""
    backend: str = "embedded"
    """Engine (default: the environment's first backend): 'embedded' = our pure-Python simulators (envs/household, envs/webshop);
    'alfworld' = the real alfworld/TextWorld engine on game files; 'webshop' = the upstream
    WebShop text environment (when its package is importable)."""
    data_path: str | None = None
    """Game/catalogue root. ALFWorld: the folder holding json_2.1.1/ (default $ALFWORLD_DATA for
    backend 'alfworld'; None with backend 'embedded' = generated households). WebShop: the folder
    holding items_shuffle*.json, items_ins_v2*.json, items_human_ins.json (None = a synthetic
    catalogue generated from `webshop_num_products` and `webshop_catalogue_seed`)."""
    webshop_goal_mode: Literal["synthetic", "human"] = "synthetic"
    """WebShop goals: 'synthetic' (one per option combination) or 'human' (items_human_ins.json)."""
    webshop_num_products: int = Field(default=200, ge=1)
    """Products in the synthetic catalogue used when `data_path` is None."""
    webshop_catalogue_seed: int = 0
    """Seed of the synthetic catalogue and of goal price limits (runs are reproducible)."""
    webshop_success_score: float = Field(default=1.0, gt=0.0, le=1.0)
    """WebShop reward = reward_scale if the purchase score >= this (upstream success: exactly 1.0)."""
    webshop_show_attrs: bool = False
    """Upstream WebAgentTextEnv's `show_attrs`: item pages get an Attributes button and sub-page (the
    product's attributes, category, query and product category). Upstream's default is off."""
    webshop_num_prev_obs: int = Field(default=0, ge=0)
    """Upstream's `num_prev_obs`: each step's observation is prefixed with up to this many earlier
    observations, ' [SEP] '-joined (upstream's state string). 0 = the current page only."""
    webshop_num_prev_actions: int = Field(default=0, ge=0)
    """Upstream's `num_prev_actions`: likewise with up to this many actions, the current one included."""
    preset: PresetName = "easy"
    """Difficulty preset the knobs below override: easy | standard | hard."""
    task_types: tuple[TaskType, ...] | None = None
    """Task types to generate (seed % len picks the type); None = the preset's."""
    num_receptacles_min: int | None = Field(default=None, ge=4)
    """Fewest receptacles in a room (>= 4, the most any room kind requires); None = preset."""
    num_receptacles_max: int | None = Field(default=None, ge=4, le=15)
    """Most receptacles in a room (<= 15 keeps the expert within 50 steps); None = preset."""
    num_closed_max: int | None = Field(default=None, ge=0)
    """At most this many openable receptacles start closed, the rest open; None = preset."""
    num_distractors_min: int | None = Field(default=None, ge=0)
    """Fewest non-goal objects in a room; None = preset."""
    num_distractors_max: int | None = Field(default=None, ge=0)
    """Most non-goal objects in a room; None = preset."""
    max_steps: int = Field(default=50, ge=1)
    """Episode horizon: the episode ends (won=False) after this many steps without a win.
    Default 50 for ALFWorld and 15 for WebShop (verl-agent's settings)."""
    reward_scale: float = 10.0
    """Reward on the winning step (reward = reward_scale x won; verl-agent uses 10)."""

    def __hash__(self) -> int:
        """Hashable although `options` is a dict (per-config caches key on the config)."""
        return hash(self.model_dump_json())

    @model_validator(mode="before")
    @classmethod
    def _per_env_defaults(cls, data: Any) -> Any:
        """Resolve the plugin (by `plugin` spec or by `name`) and apply its default step limit."""
        if not isinstance(data, dict):
            return data
        if data.get("plugin"):
            plugin = registry.register_spec(str(data["plugin"]))
            if data.get("name", plugin.name) != plugin.name:
                raise ValueError(f"env.name={data['name']!r} but env.plugin={data['plugin']!r} gives env "
                                 f"{plugin.name!r}: drop env.name or make them agree")
            data = {**data, "name": plugin.name}
        else:
            plugin = registry.get_plugin(str(data.get("name", "alfworld")))
        if "backend" not in data:
            data = {**data, "backend": plugin.backends[0]}
        if "max_steps" not in data and plugin.default_max_steps is not None:
            data = {**data, "max_steps": plugin.default_max_steps}
        return data

    @model_validator(mode="after")
    def _knobs_are_consistent(self) -> EnvConfig:
        plugin = registry.plugin_for(self)
        if self.backend not in plugin.backends:
            raise ValueError(f"env.backend {self.backend!r} does not run env.name {self.name!r}; use one of "
                             f"{tuple(plugin.backends)}")
        self.difficulty()  # raises ValueError with the offending knob values
        plugin.check_config(self)
        return self

    def webshop_env_kwargs(self) -> dict[str, Any]:
        """The upstream WebAgentTextEnv options this config sets, by upstream name (all of
        WEBSHOP_ENV_KWARGS, defaults included)."""
        return {name: getattr(self, field) for name, field in WEBSHOP_ENV_KWARGS.items()}

    def with_webshop_env_kwargs(self, env_kwargs: dict[str, Any], *, where: str = "env_kwargs") -> EnvConfig:
        """This config with upstream options (by upstream name) applied; an unknown or ill-typed option
        is a ValueError naming it, `where` and the known ones (a non-object: TypeError)."""
        if not isinstance(env_kwargs, dict):
            raise TypeError(f"{where}: expected an object of WebShop options, got {type(env_kwargs).__name__}")
        unknown = sorted(set(env_kwargs) - set(WEBSHOP_ENV_KWARGS))
        if unknown:
            raise ValueError(f"{where}: unknown WebShop option(s) {unknown}; known: {', '.join(WEBSHOP_ENV_KWARGS)}")
        update = {WEBSHOP_ENV_KWARGS[k]: v for k, v in env_kwargs.items()}
        try:
            return EnvConfig.model_validate({**self.model_dump(exclude_unset=True), **update})
        except ValueError as err:
            raise ValueError(f"{where}: invalid WebShop option(s) {env_kwargs}: {err}") from err

    def difficulty(self) -> Difficulty:
        """The preset with every explicitly set knob applied; validates the combination."""
        overrides = {
            knob: getattr(self, knob)
            for knob in (
                "task_types",
                "num_receptacles_min",
                "num_receptacles_max",
                "num_closed_max",
                "num_distractors_min",
                "num_distractors_max",
            )
            if getattr(self, knob) is not None
        }
        return replace(PRESETS[self.preset], **overrides)


WEBSHOP_ENV_KWARGS: dict[str, str] = {
    "show_attrs": "webshop_show_attrs",
    "num_prev_obs": "webshop_num_prev_obs",
    "num_prev_actions": "webshop_num_prev_actions",
}
"""Upstream WebAgentTextEnv keyword -> EnvConfig field, for the options that change what the agent
sees. Not exposed: observation_mode (always 'text'), get_image (image features), filter_goals and
limit_goals (they reorder/subset goals, so a task id would name another goal), num_products (set by
the catalogue files), session / session_prefix (bookkeeping)."""
