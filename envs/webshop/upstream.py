"""`UpstreamWebShopEnv`: the real WebShop text environment (princeton-nlp/WebShop's
`web_agent_site`) behind the same gymnasium interface as the embedded `WebShopEnv`.

WebShop is not on PyPI: install it from its repository (clone, `pip install -e .` or put it on
PYTHONPATH, run its `setup.sh -d small|all` to fetch the data and build the search index). The
upstream env reads its data from its own `data/` folder (file_path = items_shuffle*.json) and
shuffles goals with seed 233; `reset(options={"task": TaskSpec})` maps task_id
"<mode>/<index>" to `reset(session=index)`. Its reward is the raw score; here reward =
reward_scale when score >= webshop_success_score, as in the embedded env.
"""

from __future__ import annotations

import importlib
import string
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
from gymnasium import spaces

from envs.config import EnvConfig
from envs.webshop.actions import admissible_commands
from envs.webshop.tasks import parse_task_id, task_id

UPSTREAM_MODULE = "web_agent_site.envs.web_agent_text_env"
INSTALL_HINT = (
    "env.backend 'webshop' needs the upstream WebShop package (`web_agent_site`), which is not on PyPI: "
    "git clone https://github.com/princeton-nlp/WebShop, run its setup.sh (data + search index), and "
    "`pip install -e .` it (or add it to PYTHONPATH); or use env.backend 'embedded'"
)


def import_upstream() -> Any:
    """The upstream `WebAgentTextEnv` class, or ImportError naming how to install it."""
    try:
        module = importlib.import_module(UPSTREAM_MODULE)
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return module.WebAgentTextEnv


class UpstreamWebShopEnv(gymnasium.Env[str, str]):
    """Adapter over upstream's `WebAgentTextEnv(observation_mode='text')`."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, cfg: EnvConfig, *, env_cls: Any = None) -> None:
        self.cfg = cfg
        env_cls = env_cls or import_upstream()
        kwargs: dict[str, Any] = {
            "observation_mode": "text",
            "num_products": None,
            "human_goals": cfg.webshop_goal_mode == "human",
            **cfg.webshop_env_kwargs(),
        }
        if cfg.data_path is not None:
            root = Path(cfg.data_path).expanduser()
            shuffle = root / "items_shuffle.json"
            kwargs["file_path"] = str(shuffle if shuffle.is_file() else root / "items_shuffle_1000.json")
        self._env = env_cls(**kwargs)
        self.observation_space = spaces.Text(max_length=65_536, charset=string.printable)
        self.action_space = spaces.Text(max_length=65_536, charset=string.printable)
        self._steps, self._done, self._task_id = 0, True, ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if "task" in options:
            mode, index = parse_task_id(options["task"].task_id)
        else:
            mode, index = options.get("goal_mode", self.cfg.webshop_goal_mode), int(options.get("session", 0))
        obs, _ = self._env.reset(session=index)
        self._task_id, self._steps, self._done = task_id(mode, index), 0, False
        return obs, self._info(won=False, score=0.0)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        obs, score, done, _ = self._env.step(action)
        self._steps += 1
        score = float(score or 0.0)
        won = bool(done) and score >= self.cfg.webshop_success_score
        truncated = not done and self._steps >= self.cfg.max_steps
        self._done = bool(done) or truncated
        return obs, self.cfg.reward_scale if won else 0.0, bool(done), truncated, self._info(won, score)

    def available_actions(self) -> dict[str, Any]:
        return self._env.get_available_actions()

    def _info(self, won: bool, score: float) -> dict[str, Any]:
        goal = self._env.server.user_sessions.get(self._env.session, {}).get("goal", {})
        return {
            "admissible_commands": admissible_commands(self._env.get_available_actions()),
            "won": won,
            "score": score,
            "task_id": self._task_id,
            "task_type": str(goal.get("category", "")),
            "step": self._steps,
        }
