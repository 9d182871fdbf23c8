"""Goal sentences and goal tests per task type (ALFWorld goal library semantics, restated).

Goal tests (the agent's win condition, checked after every step):
- pick_and_place_simple: some object of class `obj` is in some receptacle of class `recep`;
- look_at_obj_in_light: the agent holds an `obj` and a toggled `toggle` lamp sits in the
  receptacle the agent is at;
- pick_{clean,heat,cool}_then_place_in_recep: as pick_and_place, and that object is clean/hot/cool;
- pick_two_obj_and_place: two distinct `obj` objects are in the same `recep`-class receptacle.
No "all receptacles closed" condition: ALFWorld's text games are won with receptacles left open.
"""

from __future__ import annotations

from collections import Counter

from envs.household.difficulty import TaskType
from envs.household.state import Goal, Item, WorldState
from envs.household.vocab import display_name

GOAL_TEMPLATES: dict[TaskType, tuple[str, str]] = {
    "pick_and_place_simple": ("put a {obj} in {recep}.", "put some {obj} on {recep}."),
    "look_at_obj_in_light": ("look at {obj} under the {toggle}.", "examine the {obj} with the {toggle}."),
    "pick_clean_then_place_in_recep": (
        "put a clean {obj} in {recep}.",
        "clean some {obj} and put it in {recep}.",
    ),
    "pick_heat_then_place_in_recep": (
        "put a hot {obj} in {recep}.",
        "heat some {obj} and put it in {recep}.",
    ),
    "pick_cool_then_place_in_recep": (
        "put a cool {obj} in {recep}.",
        "cool some {obj} and put it in {recep}.",
    ),
    "pick_two_obj_and_place": ("put two {obj} in {recep}.", "find two {obj} and put them in {recep}."),
}
"""docs/environments.md 1.4: lowercase class names, no article before the receptacle, final '.'."""

TRANSFORM_OF: dict[TaskType, str] = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}
"""Task types whose object must be transformed before placing, and the command verb."""


def goal_sentence(goal: Goal, template_index: int) -> str:
    template = GOAL_TEMPLATES[goal.task_type][template_index]
    return template.format(
        obj=display_name(goal.obj),
        recep=display_name(goal.recep or ""),
        toggle=display_name(goal.toggle or ""),
    )


def has_property(state: WorldState, item: Item, verb: str) -> bool:
    """Whether `item` is clean / hot / cool (verb 'clean' / 'heat' / 'cool')."""
    match verb:
        case "clean":
            return item in state.clean
        case "heat":
            return item in state.hot
        case "cool":
            return item in state.cool
    raise ValueError(f"unknown transform verb {verb!r}")


def goal_satisfied(goal: Goal, state: WorldState) -> bool:
    if goal.task_type == "look_at_obj_in_light":
        return _lamp_lit_while_holding(goal, state)
    placed = [
        item
        for item, recep in state.location_of.items()
        if item.otype == goal.obj and recep.rtype == goal.recep
    ]
    if goal.task_type == "pick_two_obj_and_place":
        per_recep = Counter(state.location_of[item] for item in placed)
        return any(count >= 2 for count in per_recep.values())
    verb = TRANSFORM_OF.get(goal.task_type)
    return any(verb is None or has_property(state, item, verb) for item in placed)


def _lamp_lit_while_holding(goal: Goal, state: WorldState) -> bool:
    if state.holding is None or state.holding.otype != goal.obj or state.agent_at is None:
        return False
    return any(
        lamp.otype == goal.toggle and lamp in state.toggled and recep == state.agent_at
        for lamp, recep in state.location_of.items()
    )
