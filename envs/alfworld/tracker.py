"""ALFWorld state signatures from the (action, observation) stream (docs/environments.md 5.1).

Invariants:
- Pure and deterministic: the signature of turn t depends only on the goal sentence and the
  observations 0..t (actions are accepted for the interface but never needed), so the real
  engine, the embedded `envs.household` engine and archived logs all give the same signatures.
- Turn t's signature describes the state the agent sees *before* choosing action t; the reset
  observation is turn 0 (`observe(None, obs)`).
- Fields are derived from a tracked belief (holding, where things were last seen, open/closed,
  transformed and toggled instances), never from event order alone, so a move to the wrong place
  drops the stage back (`search_obj`) by construction.
- Exact signature fields (ordered): task_type, stage, inventory, location, then what the agent
  changed in the room (`world()`): opened, placed, toggled. `location` keeps the instance number
  ("cabinet 2:open"); `inventory` is the held class ("mug") or "none"; `toggled` lists the devices
  the agent turned on ("desklamp 1"), which look_at's suffix relies on even away from the lamp.
- Abstract signature (task_id "*"): task_type, stage, inventory role (goal_obj/other/none),
  location role (goal_recep/appliance/lamp/other/middle_of_room), target_seen.
- "Nothing happens." and unrecognised text leave the belief unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from envs.types import StateSignature

ENV_NAME = "alfworld"
Stage = Literal["search_obj", "holding_obj", "transformed", "placed_1", "done"]
MIDDLE = "middle_of_room"

_NAME = r"[a-z]+ \d+"
_LIST_ITEM = re.compile(rf"\ba ({_NAME})\b")
_ARRIVE = re.compile(rf"You arrive at ({_NAME})\.")
_OPEN = re.compile(rf"You open the ({_NAME})\.")
_CLOSE = re.compile(rf"You close the ({_NAME})\.")
_PICK = re.compile(rf"You pick up the ({_NAME}) from the ({_NAME})\.")
_MOVE = re.compile(rf"You move the ({_NAME}) to the ({_NAME})\.")
_TRANSFORM = re.compile(rf"You (heat|cool|clean) the ({_NAME}) using the ({_NAME})\.")
_TURN_ON = re.compile(rf"You turn on the ({_NAME})\.")
_FACING = re.compile(rf"You are facing the ({_NAME})\.")
_CARRYING = re.compile(rf"You are carrying: a ({_NAME})\.")
_NOT_CARRYING = "You are not carrying anything."
_MIDDLE = "You are in the middle of a room."
_ON_CONTENTS = re.compile(rf"On the ({_NAME}), you see (.*?)\.(?:\s|$)")
_IN_CONTENTS = re.compile(rf"The ({_NAME}) is open\. In it, you see (.*?)\.(?:\s|$)")
_IS_CLOSED = re.compile(rf"The ({_NAME}) is closed\.")
_EXAMINE = re.compile(rf"This is a (hot and clean|cool and clean|hot|clean|cold|cool) ({_NAME})\.")
_TASK_LINE = re.compile(r"Your task is to: (.+)")

_W = r"([a-z]+)"
GOAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (task_type, re.compile(rf"^{pattern}\.?$"))
    for task_type, pattern in (
        ("pick_clean_then_place_in_recep", rf"put a clean {_W} in {_W}"),
        ("pick_clean_then_place_in_recep", rf"clean some {_W} and put it in {_W}"),
        ("pick_heat_then_place_in_recep", rf"put a hot {_W} in {_W}"),
        ("pick_heat_then_place_in_recep", rf"heat some {_W} and put it in {_W}"),
        ("pick_cool_then_place_in_recep", rf"put a cool {_W} in {_W}"),
        ("pick_cool_then_place_in_recep", rf"cool some {_W} and put it in {_W}"),
        ("pick_two_obj_and_place", rf"put two {_W} in {_W}"),
        ("pick_two_obj_and_place", rf"find two {_W} and put them in {_W}"),
        ("look_at_obj_in_light", rf"look at {_W} under the {_W}"),
        ("look_at_obj_in_light", rf"examine the {_W} with the {_W}"),
        ("pick_and_place_simple", rf"put a {_W} in {_W}"),
        ("pick_and_place_simple", rf"put some {_W} on {_W}"),
    )
)
"""Most specific first ("put a clean x in y" must not parse as pick_and_place "put a clean...")."""

TRANSFORM_VERB = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}
_EXAMINE_VERBS = {
    "hot and clean": ("heat", "clean"),
    "cool and clean": ("cool", "clean"),
    "hot": ("heat",),
    "clean": ("clean",),
    "cold": ("cool",),
    "cool": ("cool",),
}


@dataclass(frozen=True)
class Goal:
    """Parsed goal: lowercase class names; `recep` is None for look_at, `toggle` None otherwise."""

    task_type: str
    obj: str
    recep: str | None = None
    toggle: str | None = None


def parse_goal(goal_text: str) -> Goal:
    """Parse a goal sentence (six ALFWorld templates, optional final '.'); ValueError if none fits."""
    text = " ".join(goal_text.strip().lower().split())
    for task_type, pattern in GOAL_PATTERNS:
        m = pattern.match(text)
        if m:
            a, b = m.group(1), m.group(2)
            if task_type == "look_at_obj_in_light":
                return Goal(task_type, a, toggle=b)
            return Goal(task_type, a, recep=b)
    raise ValueError(f"goal sentence matches no ALFWorld template: {goal_text!r}")


def goal_or_none(goal_text: str) -> Goal | None:
    """`parse_goal`, or None for a sentence that fits no template (an archived record whose
    instruction was edited, a goal of another env): the tracker then follows the room without a
    goal object, as it does before the reset observation names one."""
    try:
        return parse_goal(goal_text)
    except ValueError:
        return None


def cls(name: str) -> str:
    """'cabinet 2' -> 'cabinet'."""
    return name.rsplit(" ", 1)[0]


@dataclass
class _Belief:
    location: str | None = None  # receptacle instance; None = middle of the room
    holding: str | None = None
    is_open: dict[str, bool] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # item -> receptacle last seen in
    props: dict[str, set[str]] = field(default_factory=dict)  # item -> {"clean","heat","cool"}
    toggled: set[str] = field(default_factory=set)
    target_seen: bool = False
    placed: dict[str, str] = field(default_factory=dict)  # item -> receptacle the agent moved it to


class AlfworldTracker:
    """Per-episode tracker. Call `observe(None, reset_obs)` first, then `observe(a_t, obs_{t+1})`.

    `task_type` may be "" to take it from the goal sentence; `goal_text` may be "" to take the
    goal from the reset observation's "Your task is to: ..." line.
    """

    def __init__(self, task_id: str, task_type: str, goal_text: str) -> None:
        self.task_id = task_id
        self._task_type = task_type
        self.goal: Goal | None = goal_or_none(goal_text) if goal_text else None
        self._b = _Belief()
        self.turn = -1

    @property
    def task_type(self) -> str:
        return self._task_type or (self.goal.task_type if self.goal else "unknown")

    # ---- stream -------------------------------------------------------------------------
    def observe(self, action: str | None, observation: str) -> StateSignature:
        """Update the belief with one observation and return the turn's exact signature."""
        if action is None:
            self._b = _Belief()
            self.turn = -1
            if self.goal is None:
                m = _TASK_LINE.search(observation)
                if m:
                    self.goal = goal_or_none(m.group(1))
        self.turn += 1
        self._update(observation)
        return self.signature()

    def _see(self, recep: str, listing: str) -> None:
        items = _LIST_ITEM.findall(listing)
        for item, at in list(self._b.where.items()):
            if at == recep and item not in items:
                del self._b.where[item]
        for item in items:
            self._b.where[item] = recep
            if self.goal and cls(item) == self.goal.obj:
                self._b.target_seen = True

    def _update(self, obs: str) -> None:
        b = self._b
        text = obs.strip()
        if m := _ARRIVE.search(text):
            b.location = m.group(1)
        elif m := _OPEN.search(text):
            b.is_open[m.group(1)] = True
        elif m := _CLOSE.search(text):
            b.is_open[m.group(1)] = False
        elif m := _PICK.search(text):
            item = m.group(1)
            b.where.pop(item, None)
            b.placed.pop(item, None)
            b.holding = item
            if self.goal and cls(item) == self.goal.obj:
                b.target_seen = True
        elif m := _MOVE.search(text):
            item, recep = m.group(1), m.group(2)
            b.where[item] = recep
            b.placed[item] = recep
            if b.holding == item:
                b.holding = None
        elif m := _TRANSFORM.search(text):
            b.props.setdefault(m.group(2), set()).add(m.group(1))
        elif m := _TURN_ON.search(text):
            b.toggled.add(m.group(1))
            if b.location is not None:
                b.where[m.group(1)] = b.location
        elif m := _FACING.search(text):
            b.location = m.group(1)
        elif m := _CARRYING.search(text):
            b.holding = m.group(1)
        elif _NOT_CARRYING in text:
            b.holding = None
        elif m := _EXAMINE.search(text):
            b.props.setdefault(m.group(2), set()).update(_EXAMINE_VERBS[m.group(1)])
        elif _MIDDLE in text and "Your task is to:" in text:
            b.location = None  # reset observation
        elif text.startswith(_MIDDLE):
            b.location = None  # `look` from the middle of the room
        # contents and open/closed state, wherever they appear (arrive, open, examine)
        for m in _IS_CLOSED.finditer(text):
            b.is_open[m.group(1)] = False
        for m in _IN_CONTENTS.finditer(text):
            b.is_open[m.group(1)] = True
            self._see(m.group(1), m.group(2))
        for m in _ON_CONTENTS.finditer(text):
            self._see(m.group(1), m.group(2))

    # ---- derived fields -------------------------------------------------------------------
    def _holding_goal_obj(self) -> bool:
        return bool(self.goal and self._b.holding and cls(self._b.holding) == self.goal.obj)

    def stage(self) -> Stage:
        g, b = self.goal, self._b
        if g is None:
            return "search_obj"
        if g.task_type == "look_at_obj_in_light":
            if not self._holding_goal_obj() or b.location is None:
                return "search_obj"
            lamps_here = [lamp for lamp, at in b.where.items() if at == b.location and cls(lamp) == g.toggle]
            if any(lamp in b.toggled for lamp in lamps_here):
                return "done"
            return "transformed" if lamps_here else "holding_obj"
        verb = TRANSFORM_VERB.get(g.task_type)
        counts: dict[str, int] = {}
        for item, at in b.where.items():
            if cls(item) == g.obj and cls(at) == g.recep and (verb is None or verb in b.props.get(item, ())):
                counts[at] = counts.get(at, 0) + 1
        best = max(counts.values(), default=0)
        if g.task_type == "pick_two_obj_and_place":
            if best >= 2:
                return "done"
            if best == 1:
                return "placed_1"
        elif best >= 1:
            return "done"
        if not self._holding_goal_obj():
            return "search_obj"
        if verb is not None and b.holding is not None and verb in b.props.get(b.holding, ()):
            return "transformed"
        return "holding_obj"

    def inventory(self) -> str:
        return cls(self._b.holding) if self._b.holding else "none"

    @property
    def holding(self) -> str | None:
        """The instance held ("soapbar 2"), which the signature keeps as its class only."""
        return self._b.holding

    def location(self) -> str:
        loc = self._b.location
        if loc is None:
            return MIDDLE
        if loc in self._b.is_open:
            return f"{loc}:{'open' if self._b.is_open[loc] else 'closed'}"
        return loc

    @property
    def target_seen(self) -> bool:
        return self._b.target_seen

    def fields(self) -> dict[str, str]:
        """All tracked fields (for logging and teacher-context summaries)."""
        return {
            "task_type": self.task_type,
            "stage": self.stage(),
            "inventory": self.inventory(),
            "location": self.location(),
            "target_seen": str(self.target_seen).lower(),
        }

    def world(self) -> dict[str, str]:
        """What the agent changed in the room: receptacles left open, objects it put down (a goal
        object with its known clean/heat/cool state, "mug 1[heat]@countertop 1") and devices it
        turned on. Part of the exact signature, so that two matched states replay the same way: a
        reference suffix that takes from a drawer it opened earlier fails where that drawer is
        closed, one that picks up a mug it heated and set down earlier and puts it away fails where
        that mug is cold, and one that walks to a desklamp it switched on before fetching the object
        (look_at is won on arrival) fails where the lamp is still off. Other objects' transformations
        are left out: no goal depends on them, so they would only split states that replay alike."""
        b, goal_obj = self._b, self.goal.obj if self.goal else None

        def put_down(item: str, recep: str) -> str:
            done = sorted(b.props.get(item, ())) if cls(item) == goal_obj else []
            return f"{item}[{'+'.join(done)}]@{recep}" if done else f"{item}@{recep}"

        return {
            "opened": ",".join(sorted(r for r, is_open in b.is_open.items() if is_open)),
            "placed": ",".join(sorted(put_down(item, recep) for item, recep in b.placed.items())),
            "toggled": ",".join(sorted(b.toggled)),
        }

    def signature(self) -> StateSignature:
        """Exact signature: (task_type, stage, inventory, location, opened, placed, toggled) under
        task_id."""
        f = {**self.fields(), **self.world()}
        keys = ("task_type", "stage", "inventory", "location", "opened", "placed", "toggled")
        return StateSignature(env=ENV_NAME, task_id=self.task_id, fields=tuple((k, f[k]) for k in keys))

    def abstract_signature(self) -> StateSignature:
        """Cross-task key: (task_type, stage, inventory role, location role, target_seen)."""
        g, b = self.goal, self._b
        inv = "none" if b.holding is None else ("goal_obj" if self._holding_goal_obj() else "other")
        if b.location is None:
            loc = MIDDLE
        elif g is not None and cls(b.location) == g.recep:
            loc = "goal_recep"
        elif g is not None and cls(b.location) == APPLIANCE.get(TRANSFORM_VERB.get(g.task_type, ""), ""):
            loc = "appliance"
        elif (
            g is not None
            and g.toggle
            and any(at == b.location and cls(lamp) == g.toggle for lamp, at in b.where.items())
        ):
            loc = "lamp"
        else:
            loc = "other"
        fields = (
            ("task_type", self.task_type),
            ("stage", self.stage()),
            ("inventory", inv),
            ("location", loc),
            ("target_seen", str(b.target_seen).lower()),
        )
        return StateSignature(env=ENV_NAME, task_id="*", fields=fields)


def signatures_for_episode(
    task_id: str,
    task_type: str,
    goal_text: str,
    observations: Sequence[str],
    actions: Sequence[str],
    *,
    abstract: bool = False,
) -> list[StateSignature]:
    """One signature per turn of an archived episode.

    `observations[0]` is the reset observation and `observations[t]` follows `actions[t-1]`.
    Returns `len(observations)` signatures (the final post-action observation included when the
    log has one, i.e. when len(observations) == len(actions) + 1).
    """
    if len(observations) not in (len(actions), len(actions) + 1):
        raise ValueError(f"{len(observations)} observations for {len(actions)} actions")
    tracker = AlfworldTracker(task_id, task_type, goal_text)
    out: list[StateSignature] = []
    for t, obs in enumerate(observations):
        sig = tracker.observe(None if t == 0 else actions[t - 1], obs)
        out.append(tracker.abstract_signature() if abstract else sig)
    return out


def held_for_episode(
    task_id: str, task_type: str, goal_text: str, observations: Sequence[str], actions: Sequence[str]
) -> list[str | None]:
    """The instance held at each observation of an archived episode (`signatures_for_episode`'s
    turns), for binding a matched reference's actions to the student's instance."""
    if len(observations) not in (len(actions), len(actions) + 1):
        raise ValueError(f"{len(observations)} observations for {len(actions)} actions")
    tracker = AlfworldTracker(task_id, task_type, goal_text)
    out: list[str | None] = []
    for t, obs in enumerate(observations):
        tracker.observe(None if t == 0 else actions[t - 1], obs)
        out.append(tracker.holding)
    return out
