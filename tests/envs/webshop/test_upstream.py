"""The upstream WebShop adapter: the not-installed error, and the wrapping over a fake
`WebAgentTextEnv` (pure unit test: the real package is not installable here)."""

from __future__ import annotations

import pytest

from envs.config import EnvConfig
from envs.registry import make_env
from envs.types import TaskSpec
from envs.webshop.upstream import UpstreamWebShopEnv, import_upstream


def test_missing_package_says_how_to_install():
    with pytest.raises(ImportError, match="princeton-nlp/WebShop.*setup.sh"):
        import_upstream()
    with pytest.raises(ImportError, match="env.backend 'embedded'"):
        make_env(EnvConfig(name="webshop", backend="webshop"))


class FakeTextEnv:
    """Records calls the way upstream's WebAgentTextEnv answers them."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.session = None
        self.server = type("S", (), {"user_sessions": {}})()
        self.page = "search"

    def reset(self, session=None):
        self.session = str(session)
        self.server.user_sessions[self.session] = {"goal": {"category": "fashion"}}
        self.page = "search"
        return "WebShop [SEP] Instruction: [SEP] buy it [SEP] Search", None

    def get_available_actions(self):
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        return {"has_search_bar": False, "clickables": []}

    def step(self, action):
        if action == "click[buy now]":
            self.page = "done"
            return "Thank you", 0.75, True, None
        return "same", 0.0, False, None


def test_wraps_the_upstream_text_env(tmp_path):
    (tmp_path / "items_shuffle_1000.json").write_text("[]")
    cfg = EnvConfig(name="webshop", backend="webshop", data_path=str(tmp_path), webshop_success_score=0.7)
    env = UpstreamWebShopEnv(cfg, env_cls=FakeTextEnv)
    assert env._env.kwargs == {
        "observation_mode": "text",
        "num_products": None,
        "human_goals": False,
        "show_attrs": False,
        "num_prev_obs": 0,
        "num_prev_actions": 0,
        "file_path": str(tmp_path / "items_shuffle_1000.json"),
    }
    shown = EnvConfig(name="webshop", backend="webshop", webshop_show_attrs=True, webshop_num_prev_obs=2)
    options = UpstreamWebShopEnv(shown, env_cls=FakeTextEnv)._env.kwargs  # the config's options reach upstream
    assert options["show_attrs"] is True and options["num_prev_obs"] == 2 and options["num_prev_actions"] == 0
    task = TaskSpec(
        env="webshop",
        task_id="synthetic/00042",
        task_type="fashion",
        split="valid_seen",
        instruction="buy it",
        seed=42,
    )
    obs, info = env.reset(options={"task": task})
    assert env._env.session == "42" and obs.endswith("Search")
    assert (
        info["admissible_commands"] == ("search[<your query>]", "click[search]")
        and info["task_type"] == "fashion"
    )
    assert env.step("search[x]")[1:4] == (0.0, False, False)
    _obs, reward, terminated, _tr, info = env.step("click[buy now]")
    assert (
        terminated
        and reward == 10.0
        and info["score"] == 0.75
        and info["won"]
        and info["admissible_commands"] == ()
    )
