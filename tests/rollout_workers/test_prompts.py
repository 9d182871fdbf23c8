"""Exact prompt text (verl-agent's ALFWorld templates) and rendering through the chat template."""

from __future__ import annotations

import functools

import pytest

from envs.alfworld.prompts import ALFWORLD_PROMPT, task_description
from rollout_workers.prompts import format_action_history, render_prompt_ids, render_turn_message

render_alfworld_message = functools.partial(render_turn_message, ALFWORLD_PROMPT)

RESET_OBS = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 1, a desk 1, and a sinkbasin 1.\n\nYour task is to: put a clean mug in cabinet."
)
ADMISSIBLE = ("go to cabinet 1", "go to desk 1", "help", "inventory", "look")
THINK_TAIL = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and "
    "present it within <action> </action> tags.\n"
)


def test_task_description():
    assert task_description(RESET_OBS) == "put a clean mug in cabinet."
    assert task_description("no task here") == ""


def test_first_step_exact_text():
    text = render_alfworld_message(
        task="put a clean mug in cabinet.",
        current_observation=RESET_OBS,
        admissible_actions=ADMISSIBLE,
        history=[],
        history_length=2,
        use_think=True,
    )
    assert text == (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
        f"Your current observation is: {RESET_OBS}\n"
        "Your admissible actions of the current situation are: "
        "['go to cabinet 1'\n 'go to desk 1'\n 'inventory'\n 'look'].\n\n" + THINK_TAIL
    )


def test_history_step_exact_text():
    history = [
        (RESET_OBS, "go to desk 1"),
        ("You arrive at desk 1. On the desk 1, you see nothing.", "look"),
        ("You are facing the desk 1. Next to it, you see nothing.", "go to cabinet 1"),
    ]
    current = "You arrive at cabinet 1. The cabinet 1 is closed."
    text = render_alfworld_message(
        task="put a clean mug in cabinet.",
        current_observation=current,
        admissible_actions=ADMISSIBLE,
        history=history,
        history_length=2,
        use_think=True,
    )
    assert text == (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. "
        "Your task is to: put a clean mug in cabinet.\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 observaitons "
        "and the corresponding actions you took: "
        "[Observation 2: 'You arrive at desk 1. On the desk 1, you see nothing.', Action 2: 'look']\n"
        "[Observation 3: 'You are facing the desk 1. Next to it, you see nothing.', Action 3: 'go to cabinet 1']\n"
        f"You are now at step 4 and your current observation is: {current}\n"
        "Your admissible actions of the current situation are: "
        "['go to cabinet 1'\n 'go to desk 1'\n 'inventory'\n 'look'].\n\n" + THINK_TAIL
    )


def test_history_shorter_than_window_and_zero_window():
    lines, shown = format_action_history([("obs a", "look")], 2)
    assert (lines, shown) == ("[Observation 1: 'obs a', Action 1: 'look']", 1)
    text = render_alfworld_message(
        task="t",
        current_observation="now",
        admissible_actions=("look",),
        history=[("obs a", "look")],
        history_length=0,
        use_think=True,
    )
    assert text.startswith(
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\nYour current"
    )


def test_no_think_variant_only_swaps_the_instructions():
    kwargs = {
        "task": "t",
        "current_observation": "now",
        "admissible_actions": ADMISSIBLE,
        "history": [("obs a", "look")],
        "history_length": 2,
    }
    think = render_alfworld_message(**kwargs, use_think=True)
    plain = render_alfworld_message(**kwargs, use_think=False)
    assert "<think>" not in plain and plain.endswith(
        "Now it's your turn to take an action.\nYou should choose an admissible action for current step "
        "and present it within <action> </action> tags.\n"
    )
    assert think.split("Now it's your turn")[0] == plain.split("Now it's your turn")[0]


def test_prompt_ids_are_the_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = render_prompt_ids(tok, "hello <action>look</action>")
    assert (
        tok.decode(ids) == "<|im_start|>user\nhello <action>look</action><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


# --- SMRC-SD teacher context slot ---------------------------------------------------------------

_HISTORY = [
    (RESET_OBS, "go to desk 1"),
    ("You arrive at desk 1. On the desk 1, you see nothing.", "look"),
]
_BLOCK = "[Training-only guidance: a successful attempt at this same task]\nline two\n[End]\n"


def _msg(history, teacher_context=None, use_think=True):
    return render_alfworld_message(
        task="put a clean mug in cabinet.",
        current_observation="You arrive at cabinet 1. The cabinet 1 is closed.",
        admissible_actions=ADMISSIBLE,
        history=history,
        history_length=2,
        use_think=use_think,
        teacher_context=teacher_context,
    )


@pytest.mark.parametrize("history", [[], _HISTORY])
@pytest.mark.parametrize("use_think", [True, False])
def test_no_teacher_context_is_byte_identical(history, use_think):
    base = _msg(history, None, use_think)
    assert _msg(history, "", use_think) == base


def test_teacher_block_first_step_placement():
    base = _msg([])
    line = "Your current observation is: "
    with_block = _msg([], _BLOCK)
    i = base.index(line)
    assert with_block == base[:i] + _BLOCK + base[i:]


def test_teacher_block_history_placement():
    base = _msg(_HISTORY)
    line = "You are now at step 3 and your current observation is: "
    with_block = _msg(_HISTORY, _BLOCK)
    i = base.index(line)
    assert with_block == base[:i] + _BLOCK + base[i:]
    # the block comes after the history lines and before the observation line
    assert with_block.index("Action 2: 'look']\n" + _BLOCK + line) > 0


def test_teacher_block_without_trailing_newline_gets_one():
    assert _msg([], "guidance") == _msg([], "guidance\n")
    assert "guidance\nYour current observation is: " in _msg([], "guidance")


def test_teacher_block_with_braces_is_verbatim():
    block = "obs '{current_observation}' {0} {}\n"
    base = _msg(_HISTORY)
    i = base.index("You are now at step")
    assert _msg(_HISTORY, block) == base[:i] + block + base[i:]


def test_teacher_block_no_think_keeps_action_only_tail():
    text = _msg(_HISTORY, _BLOCK, use_think=False)
    assert "<think>" not in text and _BLOCK in text


def test_teacher_prompt_ids_share_the_generation_header(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    student = render_prompt_ids(tok, _msg(_HISTORY))
    teacher = render_prompt_ids(tok, _msg(_HISTORY, _BLOCK))
    header = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert student[-len(header) :] == header and teacher[-len(header) :] == header
    assert len(teacher) > len(student)
