"""Upstream WebAgentTextEnv options in the embedded env (EnvConfig.webshop_*): show_attrs adds the
Attributes button and sub-page; num_prev_obs / num_prev_actions prefix the state with earlier
pages and actions exactly as upstream's step builds it; options by upstream name map onto the
config, and an unknown one is named."""

from __future__ import annotations

import pytest

from envs.config import WEBSHOP_ENV_KWARGS, EnvConfig
from envs.webshop.env import WebShopEnv

SMALL = {"name": "webshop", "webshop_num_products": 40, "webshop_catalogue_seed": 0}


def _to_item_page(env: WebShopEnv) -> tuple[str, str]:
    """Search for the goal product's title and open it; returns (results page, item page)."""
    goal = env.session.goal
    title = env.catalogue().by_asin[goal["asin"]]["Title"].lower()
    results, *_ = env.step(f"search[{title}]")
    item, *_ = env.step(f"click[{goal['asin'].lower()}]")
    return results, item


def test_show_attrs_adds_the_attributes_sub_page():
    plain, shown = WebShopEnv(EnvConfig(**SMALL)), WebShopEnv(EnvConfig(**SMALL, webshop_show_attrs=True))
    for env in (plain, shown):
        env.reset(options={"session": 3})
    _, item_plain = _to_item_page(plain)
    _, item_shown = _to_item_page(shown)
    assert "[SEP] Attributes [SEP]" not in item_plain and "click[attributes]" not in plain._info(False, 0, True)[
        "admissible_commands"]
    assert item_shown == item_plain.replace("[SEP] Reviews [SEP]", "[SEP] Reviews [SEP] Attributes [SEP]")
    assert "click[attributes]" in shown._info(False, 0, True)["admissible_commands"]
    page, *_ = shown.step("click[attributes]")
    product = shown.catalogue().by_asin[shown.session.goal["asin"]]
    assert product["product_category"] in page and product["query"] in page
    _, _, _, _, info = plain.step("click[attributes]")  # not a clickable without the option
    assert info["action_valid"] is False


def test_previous_observations_and_actions_as_upstream():
    base = WebShopEnv(EnvConfig(**SMALL))
    env = WebShopEnv(EnvConfig(**SMALL, webshop_num_prev_obs=1, webshop_num_prev_actions=2))
    start, _ = base.reset(options={"session": 3})
    assert env.reset(options={"session": 3})[0] == start  # reset returns the page alone (upstream)
    results, item = _to_item_page(base)
    goal = env.session.goal
    search = f"search[{env.catalogue().by_asin[goal['asin']]['Title'].lower()}]"
    got1, *_ = env.step(search)
    # upstream: [page, action_-1, obs_-1, action_-2] newest first, joined oldest first
    assert got1 == f"{start} [SEP] {search} [SEP] {results}"
    got2, *_ = env.step(f"click[{goal['asin'].lower()}]")
    assert got2 == " [SEP] ".join([search, results, f"click[{goal['asin'].lower()}]", item])


def test_options_by_upstream_name():
    cfg = EnvConfig(**SMALL)
    assert cfg.webshop_env_kwargs() == {"show_attrs": False, "num_prev_obs": 0, "num_prev_actions": 0}
    shown = cfg.with_webshop_env_kwargs({"show_attrs": True, "num_prev_actions": 1})
    assert shown.webshop_show_attrs and shown.webshop_num_prev_actions == 1 and shown.webshop_num_products == 40
    assert set(WEBSHOP_ENV_KWARGS) == set(shown.webshop_env_kwargs())
    with pytest.raises(ValueError, match=r"line 3: unknown WebShop option\(s\) \['get_image'\]; known: show_attrs"):
        cfg.with_webshop_env_kwargs({"get_image": 1}, where="line 3")
    with pytest.raises(ValueError, match="invalid WebShop option"):
        cfg.with_webshop_env_kwargs({"num_prev_obs": -1})
