"""A hand-built game matching docs/environments.md 1.4's example room, for exact-text tests.

Imported by tests/envs tests as a plain module (tests/envs/conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

from envs.household.state import Game, Goal, Item, Receptacle
from envs.household.vocab import can_contain_pairs, object_properties

CABINET_1 = Receptacle("Cabinet", 1, openable=True)
CABINET_2 = Receptacle("Cabinet", 2, openable=True)
COUNTERTOP = Receptacle("CounterTop", 1)
DESK = Receptacle("Desk", 1)
FRIDGE = Receptacle("Fridge", 1, openable=True)
MICROWAVE = Receptacle("Microwave", 1, openable=True)
SINK = Receptacle("SinkBasin", 1)


def item(otype: str, num: int) -> Item:
    return Item(otype, num, object_properties(otype))


MUG_1, MUG_2 = item("Mug", 1), item("Mug", 2)
BOOK, LAMP, APPLE = item("Book", 1), item("DeskLamp", 1), item("Apple", 1)


def make_tiny_game(goal: Goal, goal_text: str) -> Game:
    placement = ((MUG_1, COUNTERTOP), (MUG_2, CABINET_2), (BOOK, DESK), (LAMP, DESK), (APPLE, FRIDGE))
    return Game(
        game_id="test/tiny-00000",
        goal=goal,
        goal_text=goal_text,
        receptacles=(CABINET_1, CABINET_2, COUNTERTOP, DESK, FRIDGE, MICROWAVE, SINK),
        items=tuple(sorted(i for i, _ in placement)),
        can_contain=can_contain_pairs(),
        initial_location=placement,
        initially_open=frozenset(),
    )
