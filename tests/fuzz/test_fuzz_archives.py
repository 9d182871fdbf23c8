"""Run archives the analysis tools read back (deploy/analysis): trajectories/step_N.jsonl,
uniskill/proposals_step_N.jsonl, metrics.jsonl, config.resolved.json and eval/*.json.

Properties: a mutated or garbage archive either loads or fails with a ValueError (pydantic's
ValidationError is one) -- never KeyError / AttributeError / TypeError / IndexError; trajectories
that load (any content of the right types: observations the trackers cannot parse, signatures of
another env, empty turns) go through the routing the analyses replay (`collect_states`, every
matcher) without an exception; metrics records of any shape give a skill series or a ValueError.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest
from fuzzing import fuzz_settings, json_junk
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from deploy.analysis.compare_runs import summarize_run
from deploy.analysis.ralign_vs_rollout import load_proposals
from deploy.analysis.replay_audit import iter_steps
from deploy.analysis.teacher_intervention import collect_states, load_trajectories
from deploy.analysis.uniskill_plots import growth_summary, read_metrics
from deploy.plots import skill_series
from deploy.stages.smrc_sd import TeacherRouter
from envs.config import EnvConfig
from envs.registry import make_env
from envs.tasks import eval_tasks
from rollout_workers.config import RolloutConfig
from rollout_workers.episode import Episode
from rollout_workers.parsing import action_choice
from rollout_workers.types import Trajectory, Turn
from routing.matching import MATCHERS

FUZZ = fuzz_settings(120)
CLASS = "archived run files"

JSON_JUNK = json_junk(max_int=10**6)


def _play(env_name: str, task, traj_id: str, group_id: str, rng: random.Random, detour: int) -> Trajectory:
    """One episode on the embedded env: `detour` random admissible actions, then the expert."""
    env = make_env(EnvConfig(name=env_name, max_steps=12))
    obs, info = env.reset(options={"task": task})
    turns, won, done = [], False, False
    while not done:
        admissible = tuple(info["admissible_commands"])
        choices = [a for a in admissible if a != "help" and not a.startswith("search[<")] or ["look"]
        action = rng.choice(choices) if len(turns) < detour else env.unwrapped.expert_action()
        nxt, reward, won, truncated, info = env.step(action)
        turns.append(Turn(prompt_ids=(1, 2), response_ids=(3,), sampler_logprobs=(-1.0,),
                          response_text=action_choice(action), action=action, env_action=action, action_valid=True,
                          observation=obs, next_observation=nxt, admissible_actions=admissible, reward=reward))
        obs, done = nxt, won or truncated
    return Trajectory(task=task, group_id=group_id, traj_id=traj_id, turns=tuple(turns), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit")


@functools.cache
def _base() -> tuple[Trajectory, ...]:
    """Groups of real trajectories (ALFWorld and WebShop): successes and detours, so that routing
    finds references and matches."""
    rng = random.Random(0)
    out = []
    for env_name in ("alfworld", "webshop"):
        for i, task in enumerate(eval_tasks(EnvConfig(name=env_name), "valid_unseen", 2)):
            for j, detour in enumerate((0, 0, 2)):
                out.append(_play(env_name, task, f"{env_name}{i}_{j}", f"{env_name}g{i}", rng, detour))
    return tuple(out)


@pytest.fixture(scope="module", autouse=True)
def _played() -> None:
    """Play the base episodes before hypothesis draws from them (it forbids seeding inside strategies)."""
    _base()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_run")
    for sub in ("trajectories", "uniskill", "eval"):
        (root / sub).mkdir()
    return root


def _mutate_json(draw: st.DrawFn, value: object, depth: int = 0) -> object:
    """`value` with one random leaf or branch replaced (or a key dropped)."""
    if isinstance(value, dict) and value and depth < 6 and draw(st.integers(0, 4)) != 2:
        key = draw(st.sampled_from(sorted(value)))
        if draw(st.integers(0, 5)) == 3:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: _mutate_json(draw, value[key], depth + 1)}
    if isinstance(value, list) and value and depth < 6 and draw(st.integers(0, 4)) != 2:
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _mutate_json(draw, value[i], depth + 1), *value[i + 1:]]
    return draw(st.one_of(JSON_JUNK, st.text(max_size=30)))


@st.composite
def trajectory_lines(draw: st.DrawFn) -> list[str]:
    base = [json.loads(t.model_dump_json()) for t in _base()]
    lines = []
    for doc in draw(st.lists(st.sampled_from(base), min_size=1, max_size=8)):
        for _ in range(draw(st.integers(0, 2))):
            doc = _mutate_json(draw, doc)
        lines.append(json.dumps(doc))
    if draw(st.integers(0, 9)) == 5:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["{", "[]", "null", "7", "\"x\"", "{}"])))
    return lines


def _assert_named(err: Exception, *names: str) -> None:
    """A refusal on purpose: pydantic's verdict on a record, or a message naming the file / record."""
    assert isinstance(err, ValidationError) or any(n in str(err) for n in names), repr(err)


def _clear(folder: Path) -> None:
    for p in folder.iterdir():
        p.unlink()


@FUZZ
@given(lines=trajectory_lines(), matcher=st.sampled_from(sorted(MATCHERS)))
def test_mutated_trajectory_archives_load_or_raise_value_error(fuzz_cases, run_dir, lines, matcher):
    fuzz_cases(CLASS)
    _clear(run_dir / "trajectories")
    (run_dir / "trajectories" / "step_000001.jsonl").write_text("\n".join(lines) + "\n")
    try:
        steps = load_trajectories(run_dir)
    except ValueError as err:
        _assert_named(err)
        return
    assert [n for n, _ in steps] == ["step_000001.jsonl"]
    assert [(s, len(t)) for s, t in iter_steps(run_dir)] == [(1, len(steps[0][1]))]
    collect_states(steps, matcher)


TEXT = st.one_of(st.text(max_size=40), st.sampled_from([
    "", "You arrive at loc 1.", "On the desk 1, you see nothing.", "Your task is to: ", "You are carrying: a mug 1.",
    "WebShop [SEP] Instruction: [SEP] x [SEP] Search", "[SEP]", "Nothing happens.", "Back to Search [SEP] Page 1",
]))


@st.composite
def retyped_trajectories(draw: st.DrawFn) -> list[Trajectory]:
    """Real trajectories with contents replaced by other values of the same types."""
    out = []
    for traj in draw(st.lists(st.sampled_from(_base()), min_size=1, max_size=6)):
        turns = list(traj.turns)
        for _ in range(draw(st.integers(0, 4))):
            if not turns:
                break
            i = draw(st.integers(0, len(turns) - 1))
            field = draw(st.sampled_from(["observation", "next_observation", "env_action", "admissible_actions",
                                          "action_valid", "drop"]))
            if field == "drop":
                turns.pop(i)
                continue
            value = (draw(st.lists(TEXT, max_size=4).map(tuple)) if field == "admissible_actions" else
                     draw(st.booleans()) if field == "action_valid" else draw(TEXT))
            turns[i] = turns[i].model_copy(update={field: value})
        task = traj.task
        if draw(st.booleans()):
            task = task.model_copy(update={draw(st.sampled_from(["task_id", "instruction", "task_type"])): draw(TEXT)})
        out.append(traj.model_copy(update={
            "turns": tuple(turns), "task": task, "success": draw(st.booleans()) if draw(st.booleans()) else traj.success,
            "group_id": draw(st.sampled_from([traj.group_id, "g", "other"]))}))
    return out


@FUZZ
@given(trajs=retyped_trajectories(), matcher=st.sampled_from(sorted(MATCHERS)))
def test_loaded_trajectories_of_any_content_route(fuzz_cases, run_dir, trajs, matcher):
    fuzz_cases(CLASS)
    _clear(run_dir / "trajectories")
    (run_dir / "trajectories" / "step_000002.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    steps = load_trajectories(run_dir)
    assert steps[0][1] == trajs
    try:
        states = collect_states(steps, matcher)
    except ValueError as err:  # a tracker refusing a goal sentence it has no template for
        assert "goal sentence" in str(err), repr(err)
        return
    for state in states:
        assert 0 <= state.t < len(state.ep.traj.turns)


@functools.cache
def _proposal() -> dict:
    task = json.loads(_base()[0].task.model_dump_json())
    return {"step": 3, "candidate_id": "cand:t1", "task": task, "task_type": task["task_type"], "op": "add",
            "text": "Open closed receptacles before searching them.", "r_align": 0.2}


@FUZZ
@given(data=st.data())
def test_mutated_proposal_archives_load_or_raise_value_error(fuzz_cases, run_dir, data):
    fuzz_cases(CLASS)
    _clear(run_dir / "uniskill")
    lines = [json.dumps(_mutate_json(data.draw, _proposal())) for _ in range(data.draw(st.integers(1, 3)))]
    (run_dir / "uniskill" / "proposals_step_000003.jsonl").write_text("\n".join(lines) + "\n")
    try:
        records = load_proposals(run_dir)
    except ValueError as err:
        _assert_named(err)
        return
    assert len(records) == len(lines)


METRIC_RECORD = st.one_of(
    JSON_JUNK,
    st.fixed_dictionaries({"step": st.one_of(st.integers(0, 50), JSON_JUNK, st.just(1e300))}, optional={
        "uniskill/op_add": st.one_of(st.floats(0, 1), JSON_JUNK), "uniskill/parse_rate": st.one_of(st.floats(0, 1), JSON_JUNK),
        "uniskill/added": st.one_of(st.integers(0, 5), JSON_JUNK), "uniskill/decision_accepted": JSON_JUNK,
        "uniskill/bank_version": JSON_JUNK, "reward/mean": st.one_of(st.floats(allow_nan=False), JSON_JUNK),
        "uniskill/": JSON_JUNK}),
)


@FUZZ
@given(records=st.lists(METRIC_RECORD, max_size=6), raw=st.sampled_from([None, "{", "NaN", "[1]"]),
       config=st.one_of(st.none(), JSON_JUNK, st.fixed_dictionaries({"run": JSON_JUNK, "method": JSON_JUNK})),
       eval_doc=st.one_of(st.none(), JSON_JUNK))
def test_metrics_and_run_summaries_load_or_raise_value_error(fuzz_cases, run_dir, records, raw, config, eval_doc):
    fuzz_cases(CLASS)
    lines = [json.dumps(r, allow_nan=True) for r in records] + ([raw] if raw else [])
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cfg_path = run_dir / "config.resolved.json"
    cfg_path.unlink(missing_ok=True)
    if config is not None:
        cfg_path.write_text(json.dumps(config))
    _clear(run_dir / "eval")
    if eval_doc is not None:
        (run_dir / "eval" / "step_1.json").write_text(json.dumps(eval_doc))
    try:
        growth_summary(skill_series(read_metrics(run_dir)))
    except (ValueError, TypeError) as err:
        _assert_named(err, str(run_dir), "metrics record")
    try:
        summarize_run(run_dir)
    except (ValueError, TypeError) as err:
        _assert_named(err, str(run_dir), "metrics record")


LINE_BREAKERS = st.sampled_from(["\u2028", "\u2029", "\x85", "\x1c", "\r", "\r\n", "\x0b", "\x0c"])


@FUZZ
@given(trajs=retyped_trajectories(), text=st.lists(st.one_of(TEXT, LINE_BREAKERS), max_size=4).map("".join))
def test_success_buffer_checkpoint_round_trips_any_text(fuzz_cases, run_dir, trajs, text):
    """The router's success buffer (part of a checkpoint) reads back whatever text its
    trajectories hold, line separators included."""
    fuzz_cases(CLASS)
    trajs = [t.model_copy(update={"success": True, "turns": tuple(
        turn.model_copy(update={"response_text": turn.response_text + text, "next_observation": text})
        for turn in t.turns)}) for t in trajs]
    live = TeacherRouter(method="smrc_sd", matcher="structured", parts=None, audit_matchers=(),
                         rollout=RolloutConfig(), tokenizer=None, max_chars=1000, seed=0)
    live.buffer.extend(Episode(t) for t in trajs if t.turns)
    live.save(run_dir / "router_buffer.jsonl")
    resumed = TeacherRouter(method="smrc_sd", matcher="structured", parts=None, audit_matchers=(),
                            rollout=RolloutConfig(), tokenizer=None, max_chars=1000, seed=0)
    resumed.load(run_dir / "router_buffer.jsonl")
    assert [e.traj for e in resumed.buffer.items()] == [e.traj for e in live.buffer.items()]
