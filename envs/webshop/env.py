"""`WebShopEnv`: the embedded WebShop as a gymnasium environment (text mode, upstream semantics).

- reset(options={"task": TaskSpec}) or options={"session": goal index, "goal_mode": ...} returns
  upstream's raw text observation ('WebShop [SEP] Instruction: [SEP] ... [SEP] Search');
- step(action): every step counts toward `max_steps` (15 by default for WebShop), valid or not;
  an invalid action leaves page and session unchanged; `click[buy now]` ends the episode with the
  purchase score; reward = reward_scale when score >= webshop_success_score (upstream success:
  exactly 1.0), else 0; the `max_steps`-th step without a purchase is truncated;
- options of upstream's WebAgentTextEnv (EnvConfig.webshop_show_attrs / _num_prev_obs /
  _num_prev_actions) behave as upstream: an Attributes sub-page, earlier pages/actions in the state;
- info: admissible_commands (search[<your query>] first when the search bar is shown, then
  click[x] per clickable), won, score (raw score, 0 until bought), task_id, task_type, step,
  action_valid;
- stepping after the episode ended raises RuntimeError (call reset).
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

import gymnasium
from gymnasium import spaces

from envs.config import EnvConfig
from envs.types import TaskSpec
from envs.webshop import shopper
from envs.webshop.actions import admissible_commands
from envs.webshop.catalogue import Catalogue, GoalMode, catalogue_for
from envs.webshop.session import Session, StepResult
from envs.webshop.tasks import parse_task_id, task_id, task_type

_MAX_TEXT = 65_536


class WebShopEnv(gymnasium.Env[str, str]):
    """One shopping session per episode on a shared (cached) catalogue."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, cfg: EnvConfig, *, catalogues: dict[str, Catalogue] | None = None) -> None:
        if cfg.name != "webshop":
            raise ValueError(f"WebShopEnv needs env.name 'webshop', got {cfg.name!r}")
        self.cfg = cfg
        self._catalogues: dict[str, Catalogue] = dict(catalogues or {})
        self.observation_space = spaces.Text(max_length=_MAX_TEXT, charset=string.printable)
        self.action_space = spaces.Text(max_length=_MAX_TEXT, charset=string.printable)
        self._session: Session | None = None
        self._task_id = ""
        self._steps = 0
        self._done = True
        self.last_step: StepResult | None = None
        self._prev_obs: list[str] = []
        self._prev_actions: list[str] = []

    def catalogue(self, goal_mode: GoalMode | None = None) -> Catalogue:
        mode = goal_mode or self.cfg.webshop_goal_mode
        if mode not in self._catalogues:
            self._catalogues[mode] = catalogue_for(self.cfg, mode)
        return self._catalogues[mode]

    @property
    def session(self) -> Session:
        if self._session is None:
            raise RuntimeError("call reset() before using the environment")
        return self._session

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """options: {"task": TaskSpec} or {"session": goal index, "goal_mode": "synthetic"|"human"};
        neither = a random train goal drawn from `seed`."""
        super().reset(seed=seed)
        mode, index = self._resolve_goal(options or {})
        catalogue = self.catalogue(mode)
        if not 0 <= index < len(catalogue.goals):
            raise ValueError(
                f"goal index {index} out of range: the {mode} catalogue has {len(catalogue.goals)} goals"
            )
        goal = catalogue.goals[index]
        task = (options or {}).get("task")
        if task is not None and task.instruction != goal["instruction_text"]:
            raise ValueError(
                f"task {task.task_id!r} ({task.instruction!r}) is goal {goal['instruction_text']!r} here: "
                "the TaskSpec was made from another catalogue (data_path / seed / num_products)"
            )
        self._session = Session(catalogue, goal, show_attrs=self.cfg.webshop_show_attrs)
        self._task_id, self._task_type = task_id(mode, index), task_type(goal)
        self._steps, self._done, self.last_step = 0, False, None
        self._prev_obs, self._prev_actions = [self._session.observation], []
        return self._session.observation, self._info(won=False, score=0.0, valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        session = self.session
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        result = session.step(action)
        self.last_step = result
        self._steps += 1
        won = result.done and result.score >= self.cfg.webshop_success_score
        truncated = not result.done and self._steps >= self.cfg.max_steps
        self._done = result.done or truncated
        reward = self.cfg.reward_scale if won else 0.0
        return self._state(action, result.observation), reward, result.done, truncated, self._info(
            won, result.score, result.valid)

    def _state(self, action: str, observation: str) -> str:
        """Upstream's step state: the page, preceded by up to num_prev_actions actions (this one
        included) and num_prev_obs earlier pages, interleaved newest first, ' [SEP] '-joined oldest first."""
        self._prev_actions.append(action)
        parts = [observation]
        n_obs, n_act = self.cfg.webshop_num_prev_obs, self.cfg.webshop_num_prev_actions
        for i in range(1, 1 + max(n_obs, n_act)):
            if len(self._prev_actions) >= i and n_act >= i:
                parts.append(self._prev_actions[-i])
            if len(self._prev_obs) >= i and n_obs >= i:
                parts.append(self._prev_obs[-i])
        self._prev_obs.append(observation)
        return " [SEP] ".join(reversed(parts))

    def expert_action(self) -> str:
        """The scripted shopper's next action (it knows the goal asin and options)."""
        return shopper.next_action(self.session)

    def available_actions(self) -> dict[str, Any]:
        return self.session.available_actions()

    def _resolve_goal(self, options: dict[str, Any]) -> tuple[GoalMode, int]:
        task: TaskSpec | None = options.get("task")
        if task is not None:
            if task.env != "webshop":
                raise ValueError(f"task {task.task_id!r} is for env {task.env!r}, not webshop")
            return parse_task_id(task.task_id)
        mode: GoalMode = options.get("goal_mode") or self.cfg.webshop_goal_mode
        if "session" in options:
            return mode, int(options["session"])
        goals = len(self.catalogue(mode).goals)
        low = 500 if goals > 500 else 0
        return mode, int(self.np_random.integers(low, goals))

    def _info(self, won: bool, score: float, valid: bool) -> dict[str, Any]:
        session = self.session
        return {
            "admissible_commands": admissible_commands(session.available_actions()),
            "won": won,
            "score": score,
            "task_id": self._task_id,
            "task_type": self._task_type,
            "step": self._steps,
            "action_valid": valid,
        }
