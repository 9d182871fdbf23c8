"""A free-form environment defined inside the tests, loaded by "tests.envs.echo_plugin:EchoPlugin": it
lists no admissible actions and gives no state tracker, so it exercises every fallback of the
interface (standard prompt, unconstrained decoding, the generic tracker)."""

from __future__ import annotations

from typing import Any

import gymnasium

from envs.api import EnvConfig, EnvPlugin, Split, TaskSpec, standard_prompt


class EchoEnv(gymnasium.Env):
    """Say the task's word to win; anything else is echoed back."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.max_steps = cfg.max_steps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.task: TaskSpec = (options or {})["task"]
        self.steps = 0
        return f"A parrot looks at you.  Say {self.task.task_type}!", {"won": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        won = action.strip().lower() == self.task.task_type
        return f"The parrot says: {action}", 10.0 if won else 0.0, won, self.steps >= self.max_steps, {"won": won}


class EchoPlugin(EnvPlugin):
    name = "echo"
    prompt = standard_prompt("You are talking to a parrot {in a cage}.")

    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        return EchoEnv(cfg)

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        words = cfg.options.get("words", ["hello", "cracker"])
        return [TaskSpec(env=self.name, task_id=f"{split}/{i}", task_type=w, split=split, instruction=f"say {w}",
                         seed=i) for i, w in enumerate(words)]


class NotAPlugin:
    name = "broken"
