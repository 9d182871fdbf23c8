"""ScienceWorld as a gymnasium environment of the agentrl interface (`envs.api`).

- `reset(options={"task": TaskSpec})` loads the task's (task name, variation) with the configured
  simplifications and returns the task description (without its "Task Description:" header), a blank line, and the "look around" text that
  ScienceWorld's own reset produces; `info["admissible_commands"]` is ScienceWorld's valid-action
  list (`get_valid_action_object_combinations`), sorted, capped at `max_admissible` when set.
- `step(action)`: ScienceWorld's step. `info["score"]` is its 0-100 score divided by 100;
  `info["won"]` is True when the score reaches 100 (and only then); the reward is
  `reward_scale` on the winning step, else 0 (the project's outcome reward, as for the built-ins).
  `terminated` when ScienceWorld completes the task (a win, or a failure it ends, score < 0);
  `truncated` at `cfg.max_steps` steps.
- The JVM starts on the first reset (so building an env is cheap) and is reused across episodes.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from envs.api import EnvConfig, TaskSpec
from scienceworld_env import simulator
from scienceworld_env.options import ScienceWorldOptions

WIN_SCORE = 100
TASK_HEADER = "Task Description:"
"""The line ScienceWorld's task description starts with (dropped: the prompt says "Your task is to")."""


def split_task_id(task_id: str) -> tuple[str, int]:
    """"<task name>/<variation>" -> (task name, variation)."""
    name, _, variation = task_id.rpartition("/")
    if not name or not variation.isdigit():
        raise ValueError(f"ScienceWorld task id {task_id!r} is not '<task name>/<variation>'")
    return name, int(variation)


class ScienceWorldTextEnv(gymnasium.Env):
    """One ScienceWorld simulator behind the interface's reset/step (module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(self, cfg: EnvConfig) -> None:
        self._cfg = cfg
        self._opts = ScienceWorldOptions.model_validate(cfg.options)
        self._sim: Any = None
        self._steps = 0
        self._gold: list[str] = []
        self._task: TaskSpec | None = None

    def _simulator(self) -> Any:
        if self._sim is None:
            # ScienceWorld ends an episode itself past envStepLimit; ours truncates at max_steps first.
            self._sim = simulator.start(step_limit=self._cfg.max_steps + 1)
        return self._sim

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if not isinstance(task, TaskSpec):
            raise TypeError("ScienceWorldTextEnv.reset needs options={'task': TaskSpec}")
        name, variation = split_task_id(task.task_id)
        sim = self._simulator()
        sim.load(name, variation, self._opts.simplifications, generateGoldPath=self._opts.gold_path)
        look, info = sim.reset()
        self._gold = list(sim.get_gold_action_sequence()) if self._opts.gold_path else []
        self._steps, self._task = 0, task
        description = info["taskDesc"].strip().removeprefix(TASK_HEADER).strip()
        observation = f"{description}\n\n{look.strip()}"
        return observation, self._info(info, task, won=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("step before reset")
        observation, _, completed, info = self._sim.step(action)
        self._steps += 1
        won = int(info["score"]) >= WIN_SCORE
        terminated = bool(completed) or won
        truncated = not terminated and self._steps >= self._cfg.max_steps
        reward = self._cfg.reward_scale if won else 0.0
        return observation.strip(), reward, terminated, truncated, self._info(info, self._task, won=won)

    def _info(self, info: dict[str, Any], task: TaskSpec, *, won: bool) -> dict[str, Any]:
        valid = sorted(str(a) for a in info["valid"])
        cap = self._opts.max_admissible
        return {"admissible_commands": valid[:cap] if cap else valid, "won": won,
                "score": max(0, int(info["score"])) / WIN_SCORE, "task_id": task.task_id,
                "task_type": task.task_type, "step": self._steps}

    def gold_actions(self) -> list[str]:
        """ScienceWorld's gold action sequence of the loaded task (options gold_path=True)."""
        if not self._opts.gold_path:
            raise RuntimeError("gold actions need env.options.gold_path=true")
        return list(self._gold)

    def close(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim = None
