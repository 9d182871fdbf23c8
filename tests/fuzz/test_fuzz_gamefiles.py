"""ALFWorld game folders (envs.household.gamefile: game.tw-pddl + traj_data.json) and recorded
parity transcripts (envs.alfworld.parity.read_transcripts).

Property: a mutated or garbage game folder either loads and plays (engine construction, intro,
admissible commands, a few steps) or fails with `GameFileError` naming the problem; a mutated
transcript file either yields episodes the replay can walk or fails with a ValueError naming the
file and line. Never IndexError / KeyError / AttributeError / TypeError from inside the parser.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest
from fuzzing import fuzz_settings, json_junk, replay_mutated
from hypothesis import given
from hypothesis import strategies as st

from envs.alfworld.parity import read_transcripts, record, replay
from envs.household.gamefile import GameFileError, load_game
from envs.household.gamefile_engine import GameFileEngine

FUZZ = fuzz_settings(200)
CLASS_GAME = "alfworld game files"
CLASS_TRANSCRIPT = "alfworld parity transcripts"

CAB = "Cabinet_bar__minus_01_dot_00_bar__plus_01_dot_00_bar__minus_02_dot_00"
TABLE = "DiningTable_bar__minus_03_dot_00_bar__plus_00_dot_00_bar__plus_01_dot_00"
MUG = "Mug_bar__minus_01_dot_00_bar__plus_01_dot_00_bar__minus_02_dot_00"
L1, L2, L0 = "loc_bar_1_bar_1_bar_0_bar_30", "loc_bar_7_bar_1_bar_0_bar_30", "loc_bar_0_bar_0_bar_0_bar_0"


@functools.cache
def _valid_game() -> tuple[dict, dict]:
    """(game.tw-pddl, traj_data.json) of a small valid game: a mug in a closed cabinet, to be put
    on the dining table (alfworld's shipped domain and grammar)."""
    import alfworld.info

    problem = f"""(define (problem plan_t)
(:domain alfred)
(:objects agent1 - agent CabinetType - rtype DiningTableType - rtype MugType - otype
 {L0} - location {L1} - location {L2} - location {CAB} - receptacle {TABLE} - receptacle {MUG} - object)
(:init (atLocation agent1 {L0}) (receptacleType {CAB} CabinetType) (receptacleAtLocation {CAB} {L1})
 (openable {CAB}) (receptacleType {TABLE} DiningTableType) (receptacleAtLocation {TABLE} {L2})
 (objectType {MUG} MugType) (inReceptacle {MUG} {CAB}) (objectAtLocation {MUG} {L1}) (pickupable {MUG})
 (canContain DiningTableType MugType) (canContain CabinetType MugType) (= (distance {L0} {L1}) 1))
(:goal (and (exists (?r - receptacle) (and (receptacleType ?r DiningTableType)
 (exists (?o - object) (and (objectType ?o MugType) (inReceptacle ?o ?r))))) (not (holdsAny agent1)))))"""
    grammar = Path(alfworld.info.ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", "put a mug in diningtable")
    game = {"pddl_domain": Path(alfworld.info.ALFRED_PDDL_PATH).read_text(), "grammar": grammar,
            "pddl_problem": problem, "solvable": True, "walkthrough": None}
    traj = {"task_type": "pick_and_place_simple",
            "pddl_params": {"object_target": "Mug", "parent_target": "DiningTable", "object_sliced": False}}
    return game, traj


PDDL_JUNK = st.sampled_from([
    "(", ")", "()", "(not)", "(not (a) (b))", "(and)", "(or)", "(exists)", "(forall (?x) )", "(exists ?x (a))",
    "(imply (a) (b))", " - ", "- x", ":init", "(:init)", "(:goal)", "(:goal (a) (b))", "(:objects - )",
    "(= (distance a b) 3)", "(atLocation)", "(atLocation agent1)", "(receptacleAtLocation x)",
    f"(receptacleAtLocation {CAB} {L1} {L2})", f"(holds agent1 {MUG})", f"(holds {MUG})", "(objectType)",
    f"(inReceptacle {MUG})", "(opened)", "(canContain x)", f"(atLocation agent1 {L1})", "; comment\n",
    "(define)", "(:domain other)", "?x", "(ishot ?o)", f"(isClean {MUG} {CAB})", "(and " * 60 + ")" * 60,
    "\x00", "\u00e9", "))))", "((((", "(receptacleType ?r)", "(= a)",
])


@st.composite
def mutated_problem(draw: st.DrawFn, problem: str) -> str:
    text = problem
    for _ in range(draw(st.integers(1, 4))):
        anchor = draw(st.sampled_from(["(:init ", "(:goal (and ", "(:objects ", "(and ", None, None]))
        if anchor is not None:  # a well-bracketed edit inside a section, so that parsing gets deep
            i = text.find(anchor) + len(anchor)
            text = text[:i] + draw(PDDL_JUNK) + " " + text[i:]
            continue
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 80)))
        piece = draw(st.one_of(PDDL_JUNK, st.text(max_size=8), st.just("")))
        text = text[:i] + piece + text[j:] if draw(st.booleans()) else text[:i] + piece + text[i:]
    return text


JSON_JUNK = json_junk(max_text=10)


@st.composite
def game_folder_files(draw: st.DrawFn) -> tuple[bytes, bytes]:
    game, traj = (dict(x) for x in _valid_game())
    game["pddl_problem"] = draw(st.one_of(mutated_problem(game["pddl_problem"]), st.just(game["pddl_problem"])))
    for _ in range(draw(st.integers(0, 2))):
        match draw(st.sampled_from(["drop", "junk", "grammar", "domain", "traj_junk", "params", "task_type"])):
            case "drop":
                game.pop(draw(st.sampled_from(["pddl_domain", "grammar", "pddl_problem"])), None)
            case "junk":
                game[draw(st.sampled_from(["pddl_domain", "grammar", "pddl_problem"]))] = draw(JSON_JUNK)
            case "grammar":
                goal = draw(st.one_of(st.text(max_size=20), st.sampled_from(["#x#", "[a]", "{b}", '\\"', "\\u00"])))
                game["grammar"] = _valid_game()[0]["grammar"].replace("put a mug in diningtable", goal)
            case "domain" if isinstance(game.get("pddl_domain"), str):
                game["pddl_domain"] = game["pddl_domain"].replace("holds", draw(st.sampled_from(["held", ""])), 1)
            case "traj_junk":
                traj = draw(JSON_JUNK)
            case "params":
                if isinstance(traj, dict):
                    traj["pddl_params"] = draw(JSON_JUNK)
            case "task_type":
                if isinstance(traj, dict):
                    traj["task_type"] = draw(JSON_JUNK)
    if draw(st.booleans()):
        game = draw(st.one_of(st.just(game), JSON_JUNK))
    game_bytes, traj_bytes = json.dumps(game).encode(), json.dumps(traj).encode()
    # one draw in ten (not 0: hypothesis favours the bounds of a range)
    if draw(st.integers(0, 9)) == 5:  # truncated, or not UTF-8 at all
        game_bytes = draw(st.sampled_from([game_bytes[: len(game_bytes) // 2], b"\xff\xfe" + game_bytes, b""]))
    if draw(st.integers(0, 9)) == 5:
        traj_bytes = draw(st.sampled_from([traj_bytes[:5], b"\x80", b"null"]))
    return game_bytes, traj_bytes


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_games") / "trial"


def _play(game_dir: Path, seed: int) -> None:
    game = load_game(game_dir)
    engine = GameFileEngine(game)
    assert engine.intro().startswith("-= Welcome")
    rng = random.Random(seed)
    for _ in range(6):
        commands = list(engine.admissible())
        assert all(isinstance(c, str) and c for c in commands)
        engine.step(rng.choice(commands + ["go to nowhere", "take mug 9 from cabinet 1"]))
        engine.won()


def test_valid_game_plays(trial):
    trial.mkdir(parents=True, exist_ok=True)
    game, traj = _valid_game()
    (trial / "game.tw-pddl").write_text(json.dumps(game))
    (trial / "traj_data.json").write_text(json.dumps(traj))
    _play(trial, 0)


@FUZZ
@given(files=game_folder_files(), seed=st.integers(0, 1000))
def test_mutated_game_folders_load_or_raise_game_file_error(fuzz_cases, trial, files, seed):
    fuzz_cases(CLASS_GAME)
    trial.mkdir(parents=True, exist_ok=True)
    (trial / "game.tw-pddl").write_bytes(files[0])
    (trial / "traj_data.json").write_bytes(files[1])
    try:
        _play(trial, seed)
    except GameFileError as err:
        assert str(trial) in str(err) or "game.tw-pddl" in str(err) or "traj_data" in str(err), str(err)


STEP = st.fixed_dictionaries({}, optional={
    "action": st.one_of(st.none(), st.text(max_size=10), JSON_JUNK), "observation": JSON_JUNK,
    "admissible_commands": JSON_JUNK, "done": JSON_JUNK, "won": JSON_JUNK})
EPISODE = st.one_of(
    JSON_JUNK,
    st.fixed_dictionaries({}, optional={
        "env": st.one_of(st.just("alfworld"), JSON_JUNK), "game": st.one_of(st.text(max_size=10), JSON_JUNK),
        "max_steps": st.one_of(st.integers(-5, 100), JSON_JUNK, st.just(1e300)),
        "steps": st.one_of(st.lists(STEP, max_size=4), JSON_JUNK)}),
)
LINE = st.one_of(EPISODE.map(lambda e: json.dumps(e)), st.text(max_size=30), st.sampled_from(["", "{", "[]", "NaN"]))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A data root holding the valid game, and episodes recorded on it by the embedded engine."""
    root = tmp_path_factory.mktemp("fuzz_alfworld_root")
    game_dir = root / "pick_and_place_simple-Mug-None-DiningTable-1" / "trial_T0"
    game_dir.mkdir(parents=True)
    game, traj = _valid_game()
    (game_dir / "game.tw-pddl").write_text(json.dumps(game))
    (game_dir / "traj_data.json").write_text(json.dumps(traj))
    out = root / "recorded.jsonl"
    record(backend="embedded", data_path=root, out=out, episodes=4, seed=0, max_steps=8)
    return root, [json.loads(line) for line in out.read_text().splitlines()]


@st.composite
def mutated_episode(draw: st.DrawFn, episode: dict) -> dict:
    """A recorded episode with a few edits: values replaced by junk, keys dropped, steps cut."""
    episode = json.loads(json.dumps(episode))
    for _ in range(draw(st.integers(0, 3))):
        match draw(st.sampled_from(["top", "drop", "step", "step_drop", "cut", "action"])):
            case "top":
                episode[draw(st.sampled_from(["game", "max_steps", "env", "steps"]))] = draw(JSON_JUNK)
            case "drop":
                episode.pop(draw(st.sampled_from(["game", "max_steps", "env", "steps"])), None)
            case "step" | "step_drop" | "action" if isinstance(episode.get("steps"), list) and episode["steps"]:
                steps = episode["steps"]
                i = draw(st.integers(0, len(steps) - 1))
                if not isinstance(steps[i], dict):
                    continue
                key = "action" if draw(st.booleans()) else draw(st.sampled_from(
                    ["action", "observation", "admissible_commands", "done", "won"]))
                if draw(st.booleans()) and key != "action":
                    steps[i].pop(key, None)
                else:
                    steps[i][key] = draw(st.one_of(JSON_JUNK, st.text(max_size=20)))
            case "cut" if isinstance(episode.get("steps"), list):
                episode["steps"] = episode["steps"][: draw(st.integers(0, 3))]
    return episode


@FUZZ
@given(lines=st.lists(LINE, min_size=1, max_size=4))
def test_transcripts_yield_walkable_episodes_or_name_the_line(fuzz_cases, trial, lines):
    fuzz_cases(CLASS_TRANSCRIPT)
    path = trial.parent / "transcripts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    try:
        for episode in read_transcripts(path):
            # what replay reads of an episode
            str(episode["game"])
            assert int(episode.get("max_steps", 50)) >= 1
            for step in episode["steps"][1:]:
                assert isinstance(step["action"], str)
            for step in episode["steps"]:
                [step.get(f) for f in ("observation", "admissible_commands", "done", "won")]
    except (ValueError, TypeError) as err:  # raised on purpose: it names the file and line
        assert str(path) in str(err), repr(err)


@FUZZ
@given(data=st.data())
def test_mutated_recordings_replay_or_name_the_line(fuzz_cases, recorded, data):
    """Recorded episodes, mutated, replay on the embedded engine into a report (mismatches are
    fine) or fail with a ValueError naming the transcript file and line."""
    fuzz_cases(CLASS_TRANSCRIPT)
    root, episodes = recorded
    picked = data.draw(st.lists(st.sampled_from(episodes), min_size=1, max_size=2))
    lines = [json.dumps(data.draw(mutated_episode(e))) for e in picked]
    path = root / "mutated.jsonl"
    path.write_text("\n".join(lines) + "\n")
    replay_mutated(replay, root, path)


def test_unmutated_recordings_replay_identically(recorded):
    root, episodes = recorded
    path = root / "same.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in episodes) + "\n")
    report = replay(backend="embedded", data_path=root, transcripts=path)
    assert report.total_steps > 0 and report.identical_steps == report.total_steps, report.lines()[:5]
