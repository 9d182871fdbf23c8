"""ALFWorld's ground-truth skills, for the testbed's skill and proposer SFT turns and the skill-gain
measurement (`deploy.testbed`, through `AlfworldPlugin.ground_truth`).

Embedded household (both presets, any ALFWorld-style goal sentence): where objects of the goal's
class tend to be (`envs.household.vocab.OBJECT_RECEPTACLES`, most likely first: the prior the
generator places objects by and the expert explores by), which appliance does the transform
(clean: sinkbasin, heat: microwave, cool: fridge), where lamps stand, and the task type's steps.
Every skill is general advice (object classes and steps, never object numbers); the irrelevant one
(another task type and other object classes) never names the task's object, goal receptacle,
appliance or lamp.
"""

from __future__ import annotations

import random
import re

from envs.config import EnvConfig
from envs.household.difficulty import TASK_TYPES
from envs.household.goals import GOAL_TEMPLATES, TRANSFORM_OF
from envs.household.vocab import (
    CLEANABLE,
    CLEANERS,
    COOLABLE,
    COOLERS,
    HEATABLE,
    HEATERS,
    LAMPS,
    LOOKABLE,
    OBJECT_RECEPTACLES,
)
from envs.types import TaskSpec

_APPLIANCE = {"clean": CLEANERS, "heat": HEATERS, "cool": COOLERS}
_OBJECTS = {name.lower(): name for name in OBJECT_RECEPTACLES}
_PLACES_SHOWN = 4


def listing(words: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def mentions(text: str, word: str) -> bool:
    """`word` occurs in `text` as a whole word (case-insensitive)."""
    return re.search(rf"\b{re.escape(word)}\b", text, flags=re.IGNORECASE) is not None


def household_goal(task: TaskSpec) -> tuple[str, str, str | None, str | None]:
    """(task_type, object class, goal receptacle, lamp) in lowercase display form, read from the goal
    sentence with the goal templates of the task's type. A ValueError names a sentence that no
    template of that type spells."""
    templates = GOAL_TEMPLATES.get(task.task_type)  # type: ignore[call-overload]
    if templates is None:
        raise ValueError(f"task {task.task_id!r}: unknown household task type {task.task_type!r}; "
                         f"known: {', '.join(TASK_TYPES)}")
    for template in templates:
        pattern = re.escape(template)
        for field in ("obj", "recep", "toggle"):
            pattern = pattern.replace(re.escape("{" + field + "}"), f"(?P<{field}>[a-z]+)")
        m = re.fullmatch(pattern, task.instruction.strip().lower())
        if m:
            fields = m.groupdict()
            return task.task_type, fields["obj"], fields.get("recep"), fields.get("toggle")
    raise ValueError(f"task {task.task_id!r}: goal sentence {task.instruction!r} matches no "
                     f"{task.task_type} template {templates}")


def likely_places(obj: str, *, exclude: frozenset[str] = frozenset()) -> list[str]:
    """Receptacle classes (lowercase) where objects of class `obj` tend to be, most likely first."""
    cls = _OBJECTS.get(obj)
    if cls is None:
        raise ValueError(f"unknown household object class {obj!r}")
    return [r.lower() for r in OBJECT_RECEPTACLES[cls] if r.lower() not in exclude][:_PLACES_SHOWN]


def household_skill(task_type: str, obj: str, recep: str | None, toggle: str | None, *,
                    exclude: frozenset[str] = frozenset()) -> str:
    """The ground-truth skill for a household goal (lowercase class names); `exclude`: receptacle
    classes not to list among the likely places."""
    where = f"a {obj} is most often on or in the {listing(likely_places(obj, exclude=exclude))}"
    search = (f"To find it, {where}; go to those places first, open them if they are closed, and take "
              f"the {obj} when you see it.")
    match task_type:
        case "look_at_obj_in_light":
            lamp_cls = next(c for c in LAMPS if c.lower() == toggle)
            lamps = [r.lower() for r in OBJECT_RECEPTACLES[lamp_cls] if r.lower() not in exclude]
            return (f"To look at a {obj} under a {toggle}: {search} Then, holding the {obj}, go to the "
                    f"{listing(lamps)} where the {toggle} stands and use the {toggle}.")
        case "pick_two_obj_and_place":
            return (f"To put two {obj} in a {recep}: {search} Move it to a {recep}, then find a second {obj} "
                    f"the same way and move it to the same {recep}.")
        case "pick_and_place_simple":
            return f"To put a {obj} in a {recep}: {search} Then go to a {recep} and move the {obj} to it."
    verb = TRANSFORM_OF.get(task_type)  # type: ignore[call-overload]
    if verb is None:
        raise ValueError(f"unknown household task type {task_type!r}; known: {', '.join(TASK_TYPES)}")
    appliance = _APPLIANCE[verb].lower()
    return (f"To {verb} a {obj} and put it in a {recep}: {search} Go to the {appliance} and {verb} the {obj} "
            f"with the {appliance}, then go to a {recep} and move the {obj} to it.")


def _fits(task_type: str, cls: str) -> bool:
    verb = TRANSFORM_OF.get(task_type)  # type: ignore[call-overload]
    if task_type == "look_at_obj_in_light":
        return cls in LOOKABLE
    if verb is not None:
        return cls in {"clean": CLEANABLE, "heat": HEATABLE, "cool": COOLABLE}[verb]
    return cls not in LAMPS


def _task_words(task_type: str, obj: str, recep: str | None, toggle: str | None) -> frozenset[str]:
    """The words that tie a skill to this task: its object, receptacle, lamp and appliance."""
    verb = TRANSFORM_OF.get(task_type)  # type: ignore[call-overload]
    words = {obj, recep, toggle, _APPLIANCE[verb].lower() if verb else None}
    return frozenset(w for w in words if w)


def household_irrelevant_skill(task: TaskSpec, rng: random.Random, *, task_types: tuple[str, ...]) -> str:
    """A ground-truth skill for another task type (from `task_types` when it has another, else any)
    and another object class, naming none of this task's object, receptacle, lamp or appliance."""
    task_type, obj, recep, toggle = household_goal(task)
    banned = _task_words(task_type, obj, recep, toggle)
    others = [t for t in task_types if t != task_type] or [t for t in TASK_TYPES if t != task_type]
    for _ in range(200):
        other = rng.choice(others)
        cls = rng.choice([c for c in OBJECT_RECEPTACLES if _fits(other, c) and c.lower() not in banned])
        places = [r.lower() for r in OBJECT_RECEPTACLES[cls] if r.lower() not in banned]
        if not places:
            continue
        lamp = rng.choice([c.lower() for c in LAMPS]) if other == "look_at_obj_in_light" else None
        target = rng.choice(places) if other != "look_at_obj_in_light" else None
        words = _task_words(other, cls.lower(), target, lamp)
        if words & banned:
            continue
        text = household_skill(other, cls.lower(), target, lamp, exclude=banned)
        if not any(mentions(text, w) for w in banned):
            return text
    raise ValueError(f"task {task.task_id!r}: found no irrelevant skill avoiding {sorted(banned)}")


class AlfworldGroundTruth:
    """The testbed's skills for an ALFWorld task (`envs.api.GroundTruthSkills`)."""

    def helpful(self, cfg: EnvConfig, task: TaskSpec) -> str:
        return household_skill(*household_goal(task))

    def irrelevant(self, cfg: EnvConfig, task: TaskSpec, rng: random.Random) -> str:
        return household_irrelevant_skill(task, rng, task_types=tuple(cfg.difficulty().task_types))

    def vague(self, cfg: EnvConfig, task: TaskSpec) -> str:
        _, obj, _, _ = household_goal(task)
        return f"For this kind of household task, look around for the {obj} and then finish the task."
