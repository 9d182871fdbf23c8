"""KeyRoom: take the key of the right colour, then unlock the door of that colour.

A room holds one door and one key per colour (two colours by default). The task names a colour;
the episode is won by unlocking that door while holding that key. A wrong key does not fit, a
right key on another door's lock does nothing useful, and `drop key` puts the held key back.
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium

from envs.api import EnvConfig, TaskSpec

COLOURS = ("red", "blue", "green", "yellow")


def goal_colour(task: TaskSpec) -> str:
    """The task's colour (its task type is "unlock_<colour>")."""
    return task.task_type.removeprefix("unlock_")


class KeyRoomEnv(gymnasium.Env):
    """The gymnasium side of the environment (reset/step of the agentrl interface)."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.colours = COLOURS[: int(cfg.options.get("colours", 2))]
        self.max_steps = cfg.max_steps
        self.reward_scale = cfg.reward_scale
        self.task: TaskSpec | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.task = (options or {})["task"]
        self.goal = goal_colour(self.task)
        self.order = list(self.colours)
        random.Random(self.task.task_id).shuffle(self.order)  # where things lie differs between tasks
        self.held: str | None = None
        self.steps = 0
        doors = " and ".join(f"a {c} door" for c in self.order)
        keys = " and ".join(f"a {c} key" for c in reversed(self.order))
        text = (f"You are in a small room with {doors}. On the table you see {keys}.\n\n"
                f"Your task is to: {self.task.instruction}")
        return text, self._info(won=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        words = action.strip().lower().split()
        won = False
        if words[:1] == ["take"] and len(words) == 3 and words[1] in self.colours and self.held is None:
            self.held = words[1]
            text = f"You take the {self.held} key."
        elif words[:2] == ["drop", "key"] and self.held is not None:
            text, self.held = f"You put the {self.held} key back on the table.", None
        elif words[:1] == ["unlock"] and len(words) == 3 and words[1] in self.colours and self.held is not None:
            door = words[1]
            if door != self.held:
                text = f"The {self.held} key does not fit the {door} door."
            elif door != self.goal:
                text = f"The {door} door unlocks, but it is not the door you were asked to unlock. You lock it again."
            else:
                text, won = f"The {door} door unlocks and swings open.", True
        else:
            text = "Nothing happens."
        truncated = not won and self.steps >= self.max_steps
        return text, self.reward_scale if won else 0.0, won, truncated, self._info(won=won)

    def _info(self, *, won: bool) -> dict[str, Any]:
        if self.held is None:
            actions = [f"take {c} key" for c in self.order]
        else:
            actions = [f"unlock {c} door" for c in self.order] + ["drop key"]
        return {"admissible_commands": actions, "won": won, "score": 1.0 if won else 0.0,
                "task_id": self.task.task_id if self.task else "", "step": self.steps}

    def expert_action(self) -> str:
        """The shortest winning next action (for SFT demonstrations and analyses)."""
        if self.held is None:
            return f"take {self.goal} key"
        return f"unlock {self.goal} door" if self.held == self.goal else "drop key"
