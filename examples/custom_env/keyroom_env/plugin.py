"""The KeyRoom environment as an agentrl plugin: the whole integration is this class.

Selected by `env.plugin: "keyroom_env.plugin:KeyRoomPlugin"` (or `env.name: keyroom` once this
package is installed: its pyproject declares the `agentrl.envs` entry point). `env.options.colours`
(2-4) sets how many doors and keys a room has.
"""

from __future__ import annotations

import gymnasium

from envs.api import EnvConfig, EnvPlugin, SkillVocabulary, Split, TaskSpec, standard_prompt
from keyroom_env.env import COLOURS, KeyRoomEnv

TASKS_PER_SPLIT = {"train": 200, "valid_seen": 20, "valid_unseen": 20}


class KeyRoomPlugin(EnvPlugin):
    name = "keyroom"
    prompt = standard_prompt("You are an expert agent in a small room with locked doors.")
    vocabulary = SkillVocabulary(setting="a text game about unlocking doors with keys")
    default_max_steps = 4

    def check_config(self, cfg: EnvConfig) -> None:
        unknown = sorted(set(cfg.options) - {"colours"})
        if unknown:
            raise ValueError(f"env.options: unknown KeyRoom option(s) {unknown}; known: colours")
        colours = cfg.options.get("colours", 2)
        if not isinstance(colours, int) or not 2 <= colours <= len(COLOURS):
            raise ValueError(f"env.options.colours={colours!r}: use an integer from 2 to {len(COLOURS)}")

    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        return KeyRoomEnv(cfg)

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        colours = COLOURS[: int(cfg.options.get("colours", 2))]
        tasks = []
        for i in range(TASKS_PER_SPLIT[split]):
            colour = colours[i % len(colours)]
            tasks.append(TaskSpec(env=self.name, task_id=f"{split}/{i}", task_type=f"unlock_{colour}",
                                  split=split, instruction=f"unlock the {colour} door.", seed=i))
        return tasks

    def instruction(self, reset_observation: str) -> str:
        marker = "Your task is to: "
        start = reset_observation.find(marker)
        return reset_observation[start + len(marker):].strip() if start != -1 else ""
