"""Exact ALFWorld observation strings (alfred.twl2 grammar, v0.4), as pure functions.

Restated from the grammar's feedback rules and from transcripts of the real engine:
- lists: no items -> "nothing"; one -> "a mug 1"; more -> "a x 1, a y 2, and a z 1" (the article
  is always "a", and ", and" precedes the last item even for two);
- listed things are ordered by class ascending, then instance number DESCENDING
  ("a cabinet 2, a cabinet 1, a countertop 1"), both in the room overview and in contents;
- examining an object: "hot and clean" / "cool and clean" / "hot" / "clean" / "cold" (sic: the
  single cool adjective is "cold"), lamps "This desklamp 1 is on/off.", else "There's nothing
  special about X.".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from envs.household.state import Item, Receptacle
from envs.household.vocab import display_name

WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
NOTHING_HAPPENS = "Nothing happens."

_HELP_ROWS = (
    ("look:", "look around your current location"),
    ("inventory:", "check your current inventory"),
    ("go to (receptacle):", "move to a receptacle"),
    ("open (receptacle):", "open a receptacle"),
    ("close (receptacle):", "close a receptacle"),
    ("take (object) from (receptacle):", "take an object from a receptacle"),
    ("move (object) to (receptacle):", "place an object in or on a receptacle"),
    ("examine (something):", "examine a receptacle or an object"),
    ("use (object):", "use an object"),
    ("heat (object) with (receptacle):", "heat an object using a receptacle"),
    ("clean (object) with (receptacle):", "clean an object using a receptacle"),
    ("cool (object) with (receptacle):", "cool an object using a receptacle"),
    ("slice (object) with (object):", "slice an object using a sharp object"),
)
# The engine pads each command to 36 columns, except the 'move' row whose padding was written for
# the older, shorter 'put' command and is two spaces; the text ends with a newline (the engine's
# leading newline is stripped from the feedback, as the real engine returns it).
HELP_TEXT = "Available commands:\n" + "".join(
    f"  {cmd}{'  ' if cmd.startswith('move') else ' ' * (34 - len(cmd))}{what}\n" for cmd, what in _HELP_ROWS
)


def format_list(names: Sequence[str]) -> str:
    """'nothing' | 'a x 1' | 'a x 1, and a y 1' | 'a x 1, a y 2, and a z 1'."""
    if not names:
        return "nothing"
    phrases = [f"a {n}" for n in names]
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + ", and " + phrases[-1]


def _display_order(thing: Receptacle | Item) -> tuple[str, int]:
    cls = thing.rtype if isinstance(thing, Receptacle) else thing.otype
    return display_name(cls), -thing.num


def list_things(things: Iterable[Receptacle | Item]) -> str:
    """format_list over names in display order (class ascending, number descending)."""
    return format_list([t.name for t in sorted(things, key=_display_order)])


def room_overview(receptacles: Iterable[Receptacle]) -> str:
    """What the agent sees from the start location."""
    return f"You are in the middle of a room. Looking quickly around you, you see {list_things(receptacles)}."


def welcome(receptacles: Iterable[Receptacle], goal_text: str) -> str:
    """The reset observation: banner, room overview, task line (goal_text ends with '.')."""
    return f"{WELCOME}\n\n{room_overview(receptacles)}\n\nYour task is to: {goal_text}"


def describe_receptacle(recep: Receptacle, is_open: bool, contents: Iterable[Item]) -> str:
    """State of a receptacle as seen when arriving at, opening or examining it."""
    if not recep.openable:
        return f"On the {recep.name}, you see {list_things(contents)}."
    if not is_open:
        return f"The {recep.name} is closed."
    return f"The {recep.name} is open. In it, you see {list_things(contents)}."


def arrive(recep: Receptacle, is_open: bool, contents: Iterable[Item]) -> str:
    return f"You arrive at {recep.name}. {describe_receptacle(recep, is_open, contents)}"


def opened(recep: Receptacle, contents: Iterable[Item]) -> str:
    return f"You open the {recep.name}. {describe_receptacle(recep, True, contents)}"


def closed(recep: Receptacle) -> str:
    return f"You close the {recep.name}."


def picked_up(item: Item, recep: Receptacle) -> str:
    return f"You pick up the {item.name} from the {recep.name}."


def moved(item: Item, recep: Receptacle) -> str:
    return f"You move the {item.name} to the {recep.name}."


def transformed(verb: str, item: Item, appliance: Receptacle) -> str:
    """verb in {'heat', 'cool', 'clean'}: 'You heat the mug 1 using the microwave 1.'"""
    return f"You {verb} the {item.name} using the {appliance.name}."


def turned_on(lamp: Item) -> str:
    """`use` always reports 'turn on': the engine's isToggled fact is set and never cleared."""
    return f"You turn on the {lamp.name}."


def inventory(holding: Item | None) -> str:
    if holding is None:
        return "You are not carrying anything."
    return f"You are carrying: a {holding.name}."


def look(agent_at: Receptacle | None) -> str:
    """`look` never lists neighbours here: objects are always inside receptacles."""
    if agent_at is None:
        return "You are in the middle of a room. Looking quickly around you, you see nothing."
    return f"You are facing the {agent_at.name}. Next to it, you see nothing."


def examine_item(item: Item, *, hot: bool, cool: bool, clean: bool, toggled: bool) -> str:
    """The grammar's first matching rule (hot and cool never hold together)."""
    name = item.name
    if clean and (hot or cool):
        return f"This is a {'hot' if hot else 'cool'} and clean {name}."
    if hot or clean:
        return f"This is a {'hot' if hot else 'clean'} {name}."
    if cool:
        return f"This is a cold {name}."
    if "toggleable" in item.properties:
        return f"This {name} is {'on' if toggled else 'off'}."
    return f"There's nothing special about {name}."
