"""ScienceWorld (Wang et al. 2022) for agentrl, written as a user's environment package would be: it
imports only the public interface (`envs.api`) of the core.

- Tasks: ScienceWorld's 30 task types x their variations, split by ScienceWorld's own train / dev /
  test variation lists (the project's train / valid_seen / valid_unseen); TaskSpec.task_id is
  "<task name>/<variation>", task_type the task name, seed the index in the split's list.
- Actions: ScienceWorld's valid-action list; score: its 0-100 score (success at 100), reported as
  `scienceworld_task_score` in [0, 1].
- Prompt: the standard layout (`envs.api.standard_prompt`); the task line is the task description
  the reset observation starts with.
- SMRC-SD: no tracker of its own, so routing uses the generic observation-text tracker
  (`method.matcher: history` or `observation`).
- Parity: `python -m deploy env replay --env scienceworld --gold --tasks N` (`scienceworld_env.gold`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import gymnasium
from pydantic import ValidationError

from envs.api import EnvConfig, EnvPlugin, SkillVocabulary, Split, TaskSpec, standard_prompt
from scienceworld_env import simulator
from scienceworld_env.env import ScienceWorldTextEnv
from scienceworld_env.options import ScienceWorldOptions

SYSTEM = ("You are an expert agent operating in ScienceWorld, a text-based virtual environment for "
          "elementary science experiments.")


class ScienceWorldPlugin(EnvPlugin):
    """ScienceWorld through the public interface (module docstring)."""

    name = "scienceworld"
    prompt = standard_prompt(SYSTEM)
    vocabulary = SkillVocabulary(setting="an elementary science experiment in the ScienceWorld text environment")
    fallback_chars = 30
    task_score_metric = "scienceworld_task_score"
    backends = ("scienceworld",)
    default_max_steps = 30

    def check_config(self, cfg: EnvConfig) -> None:
        try:
            opts = ScienceWorldOptions.model_validate(cfg.options)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
            raise ValueError(f"env.options for scienceworld: {problems} (known options: "
                             f"{', '.join(ScienceWorldOptions.model_fields)})") from None
        unknown = sorted(set(opts.task_names or ()) - set(simulator.task_names()))
        if unknown:
            raise ValueError(f"env.options.task_names: unknown ScienceWorld tasks {unknown}; known: "
                             f"{', '.join(simulator.task_names())}")
        try:
            simulator.require_java()
        except RuntimeError as err:
            raise ValueError(str(err)) from None

    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        return ScienceWorldTextEnv(cfg)

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        opts = ScienceWorldOptions.model_validate(cfg.options)
        names = opts.task_names or tuple(simulator.task_names())
        titles, by_task = simulator.task_titles(), simulator.variations(split, opts.task_names)
        pairs = [(name, v) for name in names for v in by_task[name]]
        return [TaskSpec(env=self.name, task_id=f"{name}/{v}", task_type=name, split=split,
                         instruction=titles[name], seed=i) for i, (name, v) in enumerate(pairs)]

    def instruction(self, reset_observation: str) -> str:
        """The task description: the reset observation's first paragraph."""
        return reset_observation.split("\n\n", 1)[0].strip()

    def constrained_actions(self, admissible: Sequence[str], instruction: str) -> list[str]:
        return list(admissible)

    def parity(self) -> ModuleType:
        from scienceworld_env import gold

        return gold
