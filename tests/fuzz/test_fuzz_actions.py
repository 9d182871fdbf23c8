"""Model output -> env action: the projection (rollout_workers.parsing) and the envs that receive
whatever it projects (embedded ALFWorld household, embedded WebShop session).

Properties: any text is projected without an exception; an invalid projection always carries one
of the documented reasons (and a valid one none); the env answers any projected action without
an exception, an action it refuses leaves the episode where it was; every constrained-decoding
choice projects back to exactly the action it encodes.
"""

from __future__ import annotations

import functools
import typing

from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from envs.config import EnvConfig
from envs.registry import make_env, registered_names
from envs.webshop.actions import SEARCH_PLACEHOLDER, admissible_commands, available_actions
from envs.webshop.catalogue import build_catalogue
from envs.webshop.env import WebShopEnv
from envs.webshop.generate import generate_raw
from envs.webshop.prompts import webshop_search_queries
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import ACTION_CLOSE, ACTION_OPEN, InvalidReason

FUZZ = fuzz_settings(300)
ENV_FUZZ = fuzz_settings(120)
REASONS = set(typing.get_args(InvalidReason))
CLASS = "action parser + projection"

# Pieces a model output is built from: the tags in every casing and order, think blocks, CJK,
# characters whose lowercase form is longer than they are, whitespace, plausible commands.
FRAGMENTS = st.sampled_from([
    ACTION_OPEN, ACTION_CLOSE, "<ACTION>", "</Action>", "<action >", "< action>", "<think>", "</think>",
    "<THINK>", "</THINK>", "\u4e2d\u6587", "\u0130", "\u0130\u0130\u0130", " ", "\n", "\t", "\u3000",
    "go to desk 1", "take mug 1 from countertop 1", "search[red shoes]", "click[buy now]", "click[< prev]",
    "click[next >]", "search[]", "click[]", "[", "]", "search[[x]]", "look", "help", "\x00", "\ufeff",
    "\u202e", "\u200d", "<|im_end|>",
])
MODEL_OUTPUT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(FRAGMENTS, st.text(max_size=12)), max_size=12).map("".join),
)


@FUZZ
@given(output=MODEL_OUTPUT, require_think=st.booleans(), env=st.sampled_from(registered_names()))
def test_any_output_projects_to_an_action_or_a_reason(fuzz_cases, output, require_think, env):
    fuzz_cases(CLASS)
    profile = rollout_profile(env)
    parsed = profile.parse_action(output, require_think=require_think)
    assert isinstance(parsed.env_action, str)
    assert (parsed.reason is None) == parsed.valid
    if not parsed.valid:
        assert parsed.reason in REASONS
    if parsed.action is None:
        assert parsed.reason == "missing_action_tags"
        assert parsed.env_action == output.lower()[-profile.fallback_chars:]
    else:
        assert parsed.env_action == parsed.action == parsed.action.strip()
    if parsed.valid:
        assert parsed.action and ACTION_CLOSE not in parsed.action
        assert not any("\u4e00" <= ch <= "\u9fff" for ch in output)
        if require_think:
            assert "<think>" in output and "</think>" in output


@functools.cache
def _webshop_env() -> WebShopEnv:
    catalogue = build_catalogue(generate_raw(num_products=12, seed=0), "synthetic", 0)
    return WebShopEnv(EnvConfig(name="webshop", max_steps=1000), catalogues={"synthetic": catalogue})


WEBSHOP_ACTIONS = st.one_of(
    MODEL_OUTPUT,
    st.builds(lambda verb, arg: f"<action>{verb}[{arg}]</action>",
              st.sampled_from(["search", "click", "Search", "CLICK", "buy", ""]),
              st.one_of(st.text(max_size=20), st.sampled_from(
                  ["buy now", "< prev", "next >", "back to search", "search", "description", "features",
                   "reviews", "attributes", "b0ik9fa3xo", "", " ", "large", "]", "["]))),
)


@ENV_FUZZ
@given(session=st.integers(0, 57), outputs=st.lists(WEBSHOP_ACTIONS, min_size=1, max_size=6))
def test_webshop_session_answers_any_projected_action(fuzz_cases, session, outputs):
    env = _webshop_env()
    obs, info = env.reset(options={"session": session})
    for output in outputs:
        fuzz_cases(CLASS)
        action = rollout_profile("webshop").parse_action(output, require_think=False).env_action
        before = (obs, info["admissible_commands"])
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and reward in (0.0, env.cfg.reward_scale)
        assert available_actions(info["admissible_commands"]) == env.available_actions()
        if not info["action_valid"]:
            assert (obs, info["admissible_commands"]) == before  # a refused action changes nothing
            assert not terminated
        if terminated or truncated:
            break


@functools.cache
def _household_env():
    return make_env(EnvConfig(name="alfworld", max_steps=1000))


@ENV_FUZZ
@given(seed=st.integers(0, 10_000), outputs=st.lists(MODEL_OUTPUT, min_size=1, max_size=6))
def test_household_answers_any_projected_action(fuzz_cases, seed, outputs):
    env = _household_env()
    obs, info = env.reset(seed=seed)
    profile = rollout_profile("alfworld")
    for choice in profile.constrained_choices(info["admissible_commands"], ""):
        parsed = profile.parse_action(choice, require_think=False)
        assert parsed.valid and parsed.env_action in info["admissible_commands"]
    for output in outputs:
        fuzz_cases(CLASS)
        action = rollout_profile("alfworld").parse_action(output, require_think=False).env_action
        admissible = info["admissible_commands"]
        obs, _reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and obs
        assert all(isinstance(a, str) for a in info["admissible_commands"])
        if " ".join(action.split()) not in admissible and action.strip() not in admissible:
            assert obs == "Nothing happens."
        if terminated or truncated:
            break


INSTRUCTION = st.one_of(
    st.text(max_size=120),
    st.builds(lambda p, o, price: f"{p}{o}{price}",
              st.sampled_from(["i need a ", "i am looking for ", "find me ", "", "I'd like the "]),
              st.text(max_size=40), st.sampled_from(["", ", and price lower than 40.00 dollars", "."])),
)


@FUZZ
@given(instruction=INSTRUCTION,
       clickables=st.lists(st.text(min_size=1, max_size=20).filter(lambda c: "<" not in c), max_size=5),
       has_search_bar=st.booleans())
def test_constrained_choices_project_back_onto_themselves(fuzz_cases, instruction, clickables, has_search_bar):
    """Every response constrained decoding allows is a valid action of exactly that text."""
    fuzz_cases(CLASS)
    clickables = [c.lower().strip() for c in clickables if c.lower().strip()]
    admissible = admissible_commands({"has_search_bar": has_search_bar, "clickables": clickables})
    queries = webshop_search_queries(instruction)
    assert all("[" not in q and "]" not in q and q == q.strip() and q for q in queries)
    profile = rollout_profile("webshop")
    choices = profile.constrained_choices(admissible, instruction)
    for choice in choices:
        inner = choice[len(ACTION_OPEN):-len(ACTION_CLOSE)]
        if "<" in inner:  # an instruction quoting the tags cannot be encoded as one action
            continue
        parsed = profile.parse_action(choice, require_think=False)
        assert parsed.env_action == inner.lower().strip()
        # CJK text is refused by rule even where the page offers it (verl-agent's projection)
        assert parsed.valid or parsed.reason == "cjk_characters"
    assert SEARCH_PLACEHOLDER not in [c[len(ACTION_OPEN):-len(ACTION_CLOSE)] for c in choices]


@FUZZ
@given(commands=st.lists(st.one_of(st.text(max_size=20), st.sampled_from(
    [SEARCH_PLACEHOLDER, "click[buy now]", "click[]", "click[x", "search[y]"])), max_size=6))
def test_admissible_tuple_roundtrips_or_names_the_bad_command(fuzz_cases, commands):
    fuzz_cases(CLASS)
    try:
        available = available_actions(commands)
    except ValueError as err:
        assert "not a WebShop admissible command" in str(err)
        return
    assert admissible_commands(available) == tuple(commands)
