"""Exact observation strings of the embedded engine (docs/environments.md 1.4, alfred.twl2)."""

from __future__ import annotations

from tiny_household import APPLE, BOOK, CABINET_1, CABINET_2, COUNTERTOP, LAMP, MUG_1, make_tiny_game

from envs.household import text
from envs.household.engine import TextEngine
from envs.household.state import Goal


def test_welcome_is_exact(engine: TextEngine) -> None:
    assert engine.intro() == (
        "-= Welcome to TextWorld, ALFRED! =-\n\n"
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 2, a cabinet 1, "
        "a countertop 1, a desk 1, a fridge 1, a microwave 1, and a sinkbasin 1.\n\n"
        "Your task is to: put a clean mug in cabinet."
    )


def test_list_formatting() -> None:
    assert text.format_list([]) == "nothing"
    assert text.format_list(["mug 1"]) == "a mug 1"
    assert text.format_list(["book 1", "desklamp 1"]) == "a book 1, and a desklamp 1"
    assert text.format_list(["x 1", "y 2", "z 1"]) == "a x 1, a y 2, and a z 1"
    # class ascending, instance number descending (as the real engine lists them)
    assert text.list_things([MUG_1, BOOK, CABINET_1, CABINET_2]) == (
        "a book 1, a cabinet 2, a cabinet 1, and a mug 1"
    )


def test_arrive_open_close_take_move(engine: TextEngine) -> None:
    assert (
        engine.step("go to desk 1")
        == "You arrive at desk 1. On the desk 1, you see a book 1, and a desklamp 1."
    )
    assert engine.step("go to cabinet 1") == "You arrive at cabinet 1. The cabinet 1 is closed."
    assert (
        engine.step("open cabinet 1")
        == "You open the cabinet 1. The cabinet 1 is open. In it, you see nothing."
    )
    assert engine.step("close cabinet 1") == "You close the cabinet 1."
    assert engine.step("open cabinet 1").endswith("you see nothing.")
    assert (
        engine.step("go to countertop 1")
        == "You arrive at countertop 1. On the countertop 1, you see a mug 1."
    )
    assert engine.step("take mug 1 from countertop 1") == "You pick up the mug 1 from the countertop 1."
    assert (
        engine.step("go to cabinet 1")
        == "You arrive at cabinet 1. The cabinet 1 is open. In it, you see nothing."
    )
    assert engine.step("move mug 1 to cabinet 1") == "You move the mug 1 to the cabinet 1."
    assert (
        engine.step("go to countertop 1")
        == "You arrive at countertop 1. On the countertop 1, you see nothing."
    )


def test_transform_feedback_and_examine(engine: TextEngine) -> None:
    engine.step("go to countertop 1")
    engine.step("take mug 1 from countertop 1")
    assert engine.step("examine mug 1") == "There's nothing special about mug 1."
    engine.step("go to sinkbasin 1")
    assert engine.step("clean mug 1 with sinkbasin 1") == "You clean the mug 1 using the sinkbasin 1."
    assert engine.step("examine mug 1") == "This is a clean mug 1."
    engine.step("go to microwave 1")
    assert engine.step("heat mug 1 with microwave 1") == "You heat the mug 1 using the microwave 1."
    assert engine.step("examine mug 1") == "This is a hot and clean mug 1."
    engine.step("go to fridge 1")
    assert engine.step("cool mug 1 with fridge 1") == "You cool the mug 1 using the fridge 1."
    assert engine.step("examine mug 1") == "This is a cool and clean mug 1."
    assert engine.state.hot == set(), "cooling clears isHot"


def test_examine_single_adjectives_and_lamp() -> None:
    assert (
        text.examine_item(APPLE, hot=True, cool=False, clean=False, toggled=False) == "This is a hot apple 1."
    )
    assert (
        text.examine_item(APPLE, hot=False, cool=True, clean=False, toggled=False)
        == "This is a cold apple 1."
    )
    assert (
        text.examine_item(LAMP, hot=False, cool=False, clean=False, toggled=True) == "This desklamp 1 is on."
    )
    assert (
        text.examine_item(LAMP, hot=False, cool=False, clean=False, toggled=False)
        == "This desklamp 1 is off."
    )


def test_inventory_look_examine_receptacle_help(engine: TextEngine) -> None:
    assert engine.step("inventory") == "You are not carrying anything."
    assert (
        engine.step("look") == "You are in the middle of a room. Looking quickly around you, you see nothing."
    )
    engine.step("go to countertop 1")
    assert engine.step("look") == "You are facing the countertop 1. Next to it, you see nothing."
    assert engine.step("examine countertop 1") == "On the countertop 1, you see a mug 1."
    engine.step("take mug 1 from countertop 1")
    assert engine.step("inventory") == "You are carrying: a mug 1."
    engine.step("go to cabinet 2")
    assert engine.step("examine cabinet 2") == "The cabinet 2 is closed."
    engine.step("open cabinet 2")
    assert engine.step("examine cabinet 2") == "The cabinet 2 is open. In it, you see a mug 2."
    help_text = engine.step("help")
    assert help_text.startswith("Available commands:\n  look:                             look around")
    assert "  move (object) to (receptacle):  place an object in or on a receptacle\n" in help_text


def test_use_lamp() -> None:
    engine = TextEngine(
        make_tiny_game(
            Goal("look_at_obj_in_light", "Book", toggle="DeskLamp"), "look at book under the desklamp."
        )
    )
    engine.step("go to desk 1")
    assert engine.step("use desklamp 1") == "You turn on the desklamp 1."
    assert engine.step("use desklamp 1") == "You turn on the desklamp 1."  # isToggled is never cleared


def test_invalid_and_inadmissible_commands_do_nothing(engine: TextEngine) -> None:
    for command in (
        "dance",
        "take mug 1 from countertop 1",
        "open countertop 1",
        "go to desk 9",
        "put mug 1 in cabinet 1",
        "",
    ):
        assert engine.step(command) == "Nothing happens."
    engine.step("go to cabinet 2")
    assert engine.step("take mug 2 from cabinet 2") == "Nothing happens.", "closed receptacle"
    assert engine.step("go to cabinet 2") == "Nothing happens.", "already here"
    assert engine.state.holding is None and engine.state.agent_at == CABINET_2


def test_commands_are_normalized(engine: TextEngine) -> None:
    assert engine.step("  Go  TO countertop 1 ").startswith("You arrive at countertop 1.")
    assert engine.state.agent_at == COUNTERTOP
