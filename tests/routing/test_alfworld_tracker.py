"""AlfworldTracker on scripted episodes and on the embedded env's expert episodes."""

from __future__ import annotations

import pytest

from envs.alfworld.tracker import AlfworldTracker, Goal, parse_goal, signatures_for_episode

STAGE_ORDER = ["search_obj", "holding_obj", "transformed", "placed_1", "done"]
RESET = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, a sinkbasin 1.\n\n"
    "Your task is to: {goal}"
)


def _run(
    goal: str, steps: list[tuple[str, str]], task_type: str = ""
) -> tuple[AlfworldTracker, list[dict[str, str]]]:
    tr = AlfworldTracker("t1", task_type, goal)
    tr.observe(None, RESET.format(goal=goal))
    out = [tr.fields()]
    for action, obs in steps:
        tr.observe(action, obs)
        out.append(tr.fields())
    return tr, out


@pytest.mark.parametrize(
    ("text", "goal"),
    [
        ("put a mug in cabinet.", Goal("pick_and_place_simple", "mug", recep="cabinet")),
        ("put some mug on sidetable.", Goal("pick_and_place_simple", "mug", recep="sidetable")),
        ("look at statue under the desklamp.", Goal("look_at_obj_in_light", "statue", toggle="desklamp")),
        ("examine the book with the floorlamp.", Goal("look_at_obj_in_light", "book", toggle="floorlamp")),
        ("put a clean mug in cabinet.", Goal("pick_clean_then_place_in_recep", "mug", recep="cabinet")),
        (
            "clean some pot and put it in fridge.",
            Goal("pick_clean_then_place_in_recep", "pot", recep="fridge"),
        ),
        (
            "put a hot apple in countertop.",
            Goal("pick_heat_then_place_in_recep", "apple", recep="countertop"),
        ),
        ("heat some egg and put it in fridge.", Goal("pick_heat_then_place_in_recep", "egg", recep="fridge")),
        ("put a cool apple in microwave.", Goal("pick_cool_then_place_in_recep", "apple", recep="microwave")),
        (
            "cool some bread and put it in cabinet",
            Goal("pick_cool_then_place_in_recep", "bread", recep="cabinet"),
        ),
        ("put two cd in safe.", Goal("pick_two_obj_and_place", "cd", recep="safe")),
        ("find two pen and put them in drawer.", Goal("pick_two_obj_and_place", "pen", recep="drawer")),
    ],
)
def test_parse_goal_six_templates(text: str, goal: Goal) -> None:
    assert parse_goal(text) == goal


def test_parse_goal_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        parse_goal("make coffee.")


@pytest.mark.parametrize("goal", ["0", "make coffee."])
def test_a_goal_of_no_template_leaves_the_tracker_without_a_goal(goal: str) -> None:
    """An archived record with an edited instruction (or reset line) still gets signatures."""
    tr = AlfworldTracker("t1", "", goal)
    assert tr.goal is None and tr.task_type == "unknown"
    first = tr.observe(None, f"You are in the middle of a room.\n\nYour task is to: {goal}")
    assert tr.goal is None and first == tr.observe("look", "You are in the middle of a room.")


def test_clean_episode_stages_inventory_location() -> None:
    goal = "put a clean mug in cabinet."
    _, f = _run(
        goal,
        [
            ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
            ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see nothing."),
            (
                "go to countertop 1",
                "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a mug 2.",
            ),
            ("take mug 2 from countertop 1", "You pick up the mug 2 from the countertop 1."),
            ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
            ("clean mug 2 with sinkbasin 1", "You clean the mug 2 using the sinkbasin 1."),
            ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is open. In it, you see nothing."),
            ("move mug 2 to cabinet 1", "You move the mug 2 to the cabinet 1."),
        ],
    )
    assert [x["stage"] for x in f] == ["search_obj"] * 4 + ["holding_obj"] * 2 + ["transformed"] * 2 + [
        "done"
    ]
    assert [x["inventory"] for x in f] == ["none"] * 4 + ["mug"] * 4 + ["none"]
    assert f[0]["location"] == "middle_of_room"
    assert f[1]["location"] == "cabinet 1:closed"
    assert f[2]["location"] == "cabinet 1:open"
    assert f[3]["location"] == "countertop 1"
    assert [x["target_seen"] for x in f[:4]] == ["false", "false", "false", "true"]
    assert all(x["task_type"] == "pick_clean_then_place_in_recep" for x in f)


def test_wrong_place_drops_back_and_nothing_happens_is_noop() -> None:
    goal = "put a hot apple in countertop."
    tr, f = _run(
        goal,
        [
            ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is open. In it, you see a apple 1."),
            ("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1."),
            ("jump", "Nothing happens."),
            ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see nothing."),
        ],
    )
    assert [x["stage"] for x in f] == [
        "search_obj",
        "search_obj",
        "holding_obj",
        "holding_obj",
        "search_obj",
        "search_obj",
    ]
    assert f[2] == f[3]
    # an unheated apple on the goal receptacle is not done
    tr.observe("go to fridge 1", "You arrive at fridge 1. The fridge 1 is open. In it, you see a apple 1.")
    tr.observe("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1.")
    tr.observe("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see nothing.")
    tr.observe("move apple 1 to countertop 1", "You move the apple 1 to the countertop 1.")
    assert tr.stage() == "search_obj"


def test_pick_two_placed_1_then_done() -> None:
    _, f = _run(
        "put two mug in cabinet.",
        [
            (
                "go to countertop 1",
                "You arrive at countertop 1. On the countertop 1, you see a mug 2, and a mug 1.",
            ),
            ("take mug 1 from countertop 1", "You pick up the mug 1 from the countertop 1."),
            ("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is open. In it, you see nothing."),
            ("move mug 1 to cabinet 2", "You move the mug 1 to the cabinet 2."),
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 2."),
            ("take mug 2 from countertop 1", "You pick up the mug 2 from the countertop 1."),
            ("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is open. In it, you see a mug 1."),
            ("move mug 2 to cabinet 2", "You move the mug 2 to the cabinet 2."),
        ],
    )
    stages = [x["stage"] for x in f]
    assert stages == ["search_obj", "search_obj", "holding_obj", "holding_obj"] + ["placed_1"] * 4 + ["done"]
    assert f[6]["inventory"] == "mug" and f[4]["inventory"] == "none"


def test_look_at_lamp_found_then_used() -> None:
    _, f = _run(
        "look at statue under the desklamp.",
        [
            (
                "go to sidetable 1",
                "You arrive at sidetable 1. On the sidetable 1, you see a desklamp 1, and a statue 1.",
            ),
            ("take statue 1 from sidetable 1", "You pick up the statue 1 from the sidetable 1."),
            ("inventory", "You are carrying: a statue 1."),
            ("use desklamp 1", "You turn on the desklamp 1."),
        ],
    )
    assert [x["stage"] for x in f] == ["search_obj", "search_obj", "transformed", "transformed", "done"]


def test_exact_vs_abstract_signature() -> None:
    tr = AlfworldTracker("task-A", "", "put a mug in cabinet.")
    sig = tr.observe(None, RESET.format(goal="put a mug in cabinet."))
    sig = tr.observe("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is closed.")
    assert sig.task_id == "task-A" and dict(sig.fields)["location"] == "cabinet 2:closed"
    assert [k for k, _ in sig.fields] == [
        "task_type",
        "stage",
        "inventory",
        "location",
        "opened",
        "placed",
        "toggled",
    ]
    ab = tr.abstract_signature()
    assert ab.task_id == "*" and dict(ab.fields)["location"] == "goal_recep"
    other = AlfworldTracker("task-B", "", "put a mug in cabinet.")
    other.observe(None, RESET.format(goal="put a mug in cabinet."))
    other.observe(
        "go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is open. In it, you see nothing."
    )
    assert other.abstract_signature() == ab  # instance and open state dropped
    assert other.signature() != sig


def test_exact_signature_records_what_the_agent_changed_in_the_room() -> None:
    """Same stage, inventory and location, but a drawer left open or an object put down elsewhere
    is a different exact state (a reference suffix would not replay the same way)."""

    def walk(steps):
        tr = AlfworldTracker("task-A", "", "put a mug in cabinet.")
        tr.observe(None, RESET.format(goal="put a mug in cabinet."))
        for action, obs in steps:
            sig = tr.observe(action, obs)
        return dict(sig.fields)

    arrive = ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a pen 1.")
    plain = walk([arrive])
    opened = walk(
        [
            ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
            ("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see nothing."),
            arrive,
        ]
    )
    moved = walk(
        [
            arrive,
            ("take pen 1 from desk 1", "You pick up the pen 1 from the desk 1."),
            ("move pen 1 to desk 1", "You move the pen 1 to the desk 1."),
        ]
    )
    assert plain["opened"] == "" and opened["opened"] == "drawer 1"
    assert plain["placed"] == "" and moved["placed"] == "pen 1@desk 1"
    assert {k: plain[k] for k in ("stage", "inventory", "location")} == {
        k: opened[k] for k in ("stage", "inventory", "location")
    }


def _exact(goal: str, steps: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Exact-signature fields before every action and after the last one."""
    obs = [RESET.format(goal=goal)] + [o for _, o in steps]
    return [dict(s.fields) for s in signatures_for_episode("task-L", "", goal, obs, [a for a, _ in steps])]


LOOK_GOAL = "examine the pencil with the desklamp."
DESK = ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a alarmclock 1, a desklamp 1.")
DRAWER = ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed.")
OPEN = ("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see a pencil 1.")
TAKE = ("take pencil 1 from drawer 1", "You pick up the pencil 1 from the drawer 1.")
USE = ("use desklamp 1", "You turn on the desklamp 1.")


def test_lamp_turned_on_before_fetching_is_part_of_the_exact_state() -> None:
    """look_at is won on arriving at a lit lamp with the object, so a reference that lit the lamp
    first ends with `go to desk 1`; a student who never lit it is a different state there even
    though stage, inventory, location, opened and placed all agree (replay-audit failures)."""
    lit_first = _exact(LOOK_GOAL, [DESK, USE, DRAWER, OPEN, TAKE, DESK])
    fetch_first = _exact(LOOK_GOAL, [DESK, DRAWER, OPEN, TAKE, DESK, USE])
    same = ("task_type", "stage", "inventory", "location", "opened", "placed")
    # after `take pencil 1` (holding the pencil at the open drawer) both agree on everything but the lamp
    ref, student = lit_first[5], fetch_first[4]
    assert {k: ref[k] for k in same} == {k: student[k] for k in same}
    assert ref["stage"] == "holding_obj" and ref["inventory"] == "pencil"
    assert ref["toggled"] == "desklamp 1" and student["toggled"] == ""
    assert ref != student
    # the lit lamp stays in the state away from it, and both episodes end done
    assert [f["toggled"] for f in lit_first] == [""] * 2 + ["desklamp 1"] * 5
    assert lit_first[-1]["stage"] == "done" and fetch_first[-1]["stage"] == "done"
    assert fetch_first[-1]["toggled"] == "desklamp 1"
    # a lamp switched on again does not change the state
    again = _exact(LOOK_GOAL, [DESK, USE, USE])
    assert again[2] == again[3]


def test_put_down_goal_object_carries_its_transformation() -> None:
    """A clean mug set down on the countertop is a different state from a dirty one (a suffix that
    takes it and puts it away only wins with the clean one); a cleaned distractor is not."""
    goal = "put a clean mug in cabinet."
    at_sink = ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.")
    at_counter = (
        "go to countertop 1",
        "You arrive at countertop 1. On the countertop 1, you see a mug 1, a cup 1.",
    )

    def set_down(item: str, clean: bool) -> dict[str, str]:
        steps = [
            at_counter,
            (f"take {item} from countertop 1", f"You pick up the {item} from the countertop 1."),
            at_sink,
        ]
        if clean:
            steps.append((f"clean {item} with sinkbasin 1", f"You clean the {item} using the sinkbasin 1."))
        steps += [at_counter, (f"move {item} to countertop 1", f"You move the {item} to the countertop 1.")]
        return _exact(goal, steps)[-1]

    assert set_down("mug 1", clean=True)["placed"] == "mug 1[clean]@countertop 1"
    assert set_down("mug 1", clean=False)["placed"] == "mug 1@countertop 1"
    assert (
        set_down("cup 1", clean=True)["placed"]
        == set_down("cup 1", clean=False)["placed"]
        == "cup 1@countertop 1"
    )
    assert set_down("mug 1", clean=True)["stage"] == set_down("mug 1", clean=False)["stage"] == "search_obj"


def test_goal_from_reset_observation_and_episode_function() -> None:
    goal = "put some mug on countertop."
    obs = [RESET.format(goal=goal), "You arrive at countertop 1. On the countertop 1, you see a mug 1."]
    sigs = signatures_for_episode("t", "", "", obs, ["go to countertop 1"])
    assert len(sigs) == 2 and dict(sigs[1].fields)["task_type"] == "pick_and_place_simple"
    with pytest.raises(ValueError):
        signatures_for_episode("t", "", goal, obs, [])


@pytest.mark.parametrize(("preset", "n"), [("easy", 12), ("standard", 30), ("hard", 30)])
def test_expert_episodes_end_done(preset: str, n: int) -> None:
    from envs.config import EnvConfig
    from envs.registry import make_env
    from envs.tasks import sample_tasks

    cfg = EnvConfig(preset=preset)  # type: ignore[arg-type]
    env = make_env(cfg)
    tasks = sample_tasks(cfg, "train", n, 123)
    if preset != "easy":
        assert len({t.task_type for t in tasks}) == 6
    for task in tasks:
        obs, _ = env.reset(options={"task": task})
        observations, actions = [obs], []
        tracker = AlfworldTracker(task.task_id, task.task_type, task.instruction)
        live = [tracker.observe(None, obs)]
        done = False
        while not done:
            action = env.expert_action()
            obs, _, term, trunc, info = env.step(action)
            observations.append(obs)
            actions.append(action)
            live.append(tracker.observe(action, obs))
            done = term or trunc
        assert info["won"], task
        offline = signatures_for_episode(
            task.task_id, task.task_type, task.instruction, observations, actions
        )
        assert offline == live
        stages = [dict(s.fields)["stage"] for s in live]
        assert stages[-1] == "done", (task.instruction, list(zip(actions, stages[1:], strict=True)))
        assert "done" not in stages[:-1], (task.instruction, stages)
        assert stages[0] == "search_obj"
        order = [STAGE_ORDER.index(x) for x in stages]
        assert order == sorted(order), (task.instruction, stages)  # the expert never regresses
        if task.task_type == "pick_two_obj_and_place":
            assert "placed_1" in stages
        if task.task_type not in ("pick_and_place_simple", "pick_two_obj_and_place"):
            assert "transformed" in stages, (task.instruction, stages)


def test_lit_lamp_state_on_the_embedded_engine() -> None:
    """On the embedded engine: a look_at reference that lights the lamp first and a student that
    fetches the object first agree on every exact field but `toggled` once both hold the object,
    and the reference's remaining suffix (`go to` the lamp) wins from the lit state only."""
    from envs.config import EnvConfig
    from envs.registry import make_env
    from envs.tasks import sample_tasks

    cfg = EnvConfig(preset="standard", task_types=["look_at_obj_in_light"], max_steps=50)  # type: ignore[arg-type]
    env = make_env(cfg)

    def play(task, actions: list[str]) -> tuple[list[dict[str, str]], bool]:
        """Each turn's exact fields, and whether the last action won."""
        obs, _ = env.reset(options={"task": task})
        tracker = AlfworldTracker(task.task_id, task.task_type, task.instruction)
        fields, won = [dict(tracker.observe(None, obs).fields)], False
        for action in actions:
            assert not won, action
            obs, _, won, _, _ = env.step(action)
            fields.append(dict(tracker.observe(action, obs).fields))
        return fields, won

    checked = 0
    for task in sample_tasks(cfg, "train", 12, 7):
        env.reset(options={"task": task})
        game = env.game
        where = dict(game.initial_location)
        lamp = next(i for i in game.items if i.otype == game.goal.toggle)
        objs = [i for i in game.items if i.otype == game.goal.obj and where[i] != where[lamp]]
        if not objs:
            continue
        obj, recep = objs[0], where[objs[0]]
        fetch = [f"go to {recep.name}"]
        fetch += [f"open {recep.name}"] if recep.openable and recep not in game.initially_open else []
        fetch += [f"take {obj.name} from {recep.name}"]
        light, back = [f"go to {where[lamp].name}", f"use {lamp.name}"], [f"go to {where[lamp].name}"]
        ref_fields, ref_won = play(task, light + fetch + back)
        st_fields, st_won = play(task, fetch + light)
        assert ref_won and st_won
        k, t = len(light) + len(fetch), len(fetch)  # right after picking the object up
        assert ref_fields[k]["toggled"] == lamp.name and st_fields[t]["toggled"] == ""
        assert ref_fields[k]["stage"] == "holding_obj" and ref_fields[k]["inventory"] == obj.name.split()[0]
        assert {f: v for f, v in ref_fields[k].items() if f != "toggled"} == {
            f: v for f, v in st_fields[t].items() if f != "toggled"
        }
        assert not play(task, fetch + back)[1]  # the reference's suffix from the student's state
        checked += 1
    assert checked >= 2
