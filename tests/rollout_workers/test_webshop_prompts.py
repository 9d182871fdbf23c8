"""verl-agent's WebShop prompt: exact template text, observation formatting, available actions,
history, the 13,000-character fallback, the no-think variant and the skill / teacher blocks."""

from __future__ import annotations

import functools

from envs.webshop.prompts import (
    MAX_HISTORY_PROMPT_CHARS,
    WEBSHOP_PROMPT,
    format_available_actions,
    format_observation,
    webshop_instruction,
)
from rollout_workers.prompts import render_skill_block, render_turn_message

render_webshop_message = functools.partial(render_turn_message, WEBSHOP_PROMPT)

INSTR = (
    "i need a slim fit men's dress shirt that is machine washable with color: navy blue, and size: large, "
    "and price lower than 50.00 dollars"
)
SEARCH = f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
RESULTS = (
    f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] "
    "B000000001 [SEP] Men's Slim Fit Cotton Dress Shirt, Long Sleeve [SEP] $24.99"
)
ITEM = (
    f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] navy blue [SEP] white "
    "[SEP] size [SEP] medium [SEP] large [SEP] Men's Slim Fit Cotton Dress Shirt, Long Sleeve [SEP] "
    "Price: $24.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
)
DONE = "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
SEARCH_ACTIONS = ("search[<your query>]", "click[search]")
RESULTS_ACTIONS = ("click[back to search]", "click[next >]", "click[b000000001]")

TEAM = "You are an expert autonomous agent operating in the WebShop e\u2011commerce environment."
THINK_TAIL = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully which admissible "
    "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
    "tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present "
    "it within <action> </action> tags.\n"
)
ACTION_TAIL = (
    "Now it's your turn to take one action for the current step.\n"
    "You should choose an admissible action for current step and present it within <action> </action> tags.\n"
)


def render(**kw) -> str:
    args = {
        "task": INSTR,
        "current_observation": SEARCH,
        "admissible_actions": SEARCH_ACTIONS,
        "history": [],
        "history_length": 2,
        "use_think": True,
    }
    return render_webshop_message(**{**args, **kw})


def test_instruction_and_observation_formatting():
    assert webshop_instruction(SEARCH) == INSTR and webshop_instruction(RESULTS) == INSTR
    assert webshop_instruction(DONE) == ""
    assert format_observation(SEARCH, INSTR) == "'Search'"
    assert format_observation(RESULTS, INSTR) == (
        "'Back to Search' [SEP] 'Page 1 (Total results: 1)' [SEP] 'Next >' [SEP] 'B000000001' [SEP] "
        "'Men's Slim Fit Cotton Dress Shirt, Long Sleeve' [SEP] '$24.99'"
    )
    assert format_observation(DONE, INSTR) == DONE  # instruction not shown: the raw text
    assert format_available_actions(SEARCH_ACTIONS) == "'search[<your query>]',\n'click[search]',"


def test_first_step_exact_text():
    assert render() == (
        f"\n{TEAM} \n"
        f"Your task is to: {INSTR}.\n"
        "Your current observation is: 'Search'.\n"
        "Your admissible actions of the current situation are: \n"
        "[\n'search[<your query>]',\n'click[search]',\n].\n\n" + THINK_TAIL
    )


def test_history_step_exact_text():
    history = [
        (SEARCH, "search[slim fit dress shirt]"),
        (RESULTS, "click[b000000001]"),
        (ITEM, "click[navy blue]"),
    ]
    text = render(current_observation=ITEM, admissible_actions=("click[buy now]",), history=history)
    item = format_observation(ITEM, INSTR)
    assert text == (
        f"\n{TEAM}\n"
        f"Your task is to: {INSTR}.\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 observations and the "
        "corresponding actions you took: "
        f"[Observation 2: '{format_observation(RESULTS, INSTR)}', Action 2: 'click[b000000001]']\n"
        f"[Observation 3: '{item}', Action 3: 'click[navy blue]']\n"
        f"You are now at step 4 and your current observation is: {item}.\n"
        "Your admissible actions of the current situation are: \n"
        "[\n'click[buy now]',\n].\n\n" + THINK_TAIL
    )
    assert render(history=history, history_length=0) == render()  # 0 = always the first-step template


def test_falls_back_to_first_step_template_past_13000_chars():
    long_obs = SEARCH.replace("[SEP] Search", "[SEP] " + "x" * 6000 + " [SEP] Search")
    history = [(long_obs, "search[a]"), (long_obs, "search[b]")]
    with_history = render(history=history[:1])
    assert "Prior to this step" in with_history and len(with_history) <= MAX_HISTORY_PROMPT_CHARS
    fallback = render(history=history)
    assert "Prior to this step" not in fallback and fallback == render()


def test_no_think_variant_only_swaps_the_instructions():
    text = render(use_think=False)
    assert text == render().replace(THINK_TAIL, ACTION_TAIL) and "<think>" not in text


def test_skill_block_goes_before_the_actions_and_teacher_block_before_the_observation():
    plain = render(
        history=[(SEARCH, "search[shirt]")], current_observation=RESULTS, admissible_actions=RESULTS_ACTIONS
    )
    skilled = render(
        history=[(SEARCH, "search[shirt]")],
        current_observation=RESULTS,
        admissible_actions=RESULTS_ACTIONS,
        skill_text="Pick the option values named in the task before buying.",
        teacher_context="[guidance]",
    )
    skill = render_skill_block("Pick the option values named in the task before buying.")
    obs_line = "You are now at step 2 and your current observation is: "
    actions_line = "Your admissible actions of the current situation are: "
    expected = plain.replace(obs_line, "[guidance]\n" + obs_line).replace(actions_line, skill + actions_line)
    assert skill and skilled == expected
    assert render(skill_text="   ", teacher_context="") == render()  # blank extras: verl-agent's text
