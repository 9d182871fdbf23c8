"""Teacher-block SFT turns (deploy/testbed/teacher_data.py) and their mixing into the SFT
(deploy/laptop/sft.py): real embedded envs, SMRC-SD's own router, a tokenizer trained in the test."""

import json
import random
from collections import Counter

import pytest

from deploy.config import TrainConfig
from deploy.laptop.sft import build_model_from_env, demo_rows, expert_episodes, extra_turns, run_sft
from deploy.laptop.tiny_model import train_tokenizer
from deploy.stages.smrc_sd import TeacherRouter
from deploy.testbed.teacher_data import (
    followed_turns,
    make_router,
    pair_turns,
    play,
    task_pair,
    teacher_turns,
    to_trajectory,
)
from envs.registry import make_env
from envs.tasks import sample_tasks
from rollout_workers.episode import Episode
from rollout_workers.parsing import action_choice
from routing.teacher_context import CANDIDATE_PREFIX, HEADER

ENVS = {
    "alfworld-easy": {"env": {"name": "alfworld", "preset": "easy"}},
    "alfworld-standard": {"env": {"name": "alfworld", "preset": "standard"}},
    "webshop": {"env": {"name": "webshop", "webshop_num_products": 150, "webshop_goal_mode": "synthetic"}},
}
TINY = {"vocab_size": 400, "hidden_size": 64, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
        "intermediate_size": 64, "max_position_embeddings": 8192}


def _cfg(env: str, **sft) -> TrainConfig:
    return TrainConfig.model_validate({**ENVS[env], "rollout": {"use_think": False},
                                       "sft": {"tiny_model": TINY, **sft}})


@pytest.fixture(scope="module")
def tokenizer():
    words = ["Reference step", "observation", "Suggested next action", "go to", "take", "from", "move", "<action>"]
    return train_tokenizer([" ".join(words)] * 20, 300)


def _pairs(cfg, n):
    env = make_env(cfg.env)
    tasks = sample_tasks(cfg.env, "train", n, seed=3)
    rng = random.Random(0)
    return [p for p in (task_pair(env, t, None, rng) for t in tasks) if p is not None]


@pytest.mark.parametrize("env", sorted(ENVS))
def test_teacher_turns_mix_matched_and_unmatched_from_another_trajectory(env, tokenizer):
    cfg = _cfg(env)
    tasks = sample_tasks(cfg.env, "train", 12, seed=1)
    episodes = expert_episodes(cfg.env, tasks)
    turns = teacher_turns(cfg, tokenizer, episodes, tasks, random.Random(0), n=24)
    kinds = Counter(t.kind for t in turns)
    assert len(turns) == 24 and set(kinds) == {"teacher_matched", "teacher_followed", "teacher_unmatched"}, kinds
    assert kinds["teacher_matched"] + kinds["teacher_followed"] == 12 and kinds["teacher_followed"] == 9, kinds
    half = Counter(t.kind for t in teacher_turns(_cfg(env, teacher_followed_share=0.5), tokenizer, episodes, tasks,
                                                 random.Random(0), n=24))
    assert (half["teacher_followed"], half["teacher_matched"]) == (6, 6), half
    for turn in turns:
        text = tokenizer.decode(list(turn.prompt_ids))
        assert HEADER in text, text[-500:]
        assert (CANDIDATE_PREFIX in text) == (turn.kind != "teacher_unmatched"), (turn.kind, text[-800:])
        target = tokenizer.decode(list(turn.target_ids))
        assert target.startswith("<action>") and target.endswith("</action><|im_end|>"), target
    # the student is a DIFFERENT successful trajectory of the same task than the reference
    pairs = _pairs(cfg, 6)
    assert pairs, "no detoured expert attempt won"
    for pair in pairs:
        assert pair.student.task_id == pair.reference.task_id and pair.student.success and pair.reference.success
        assert pair.student.actions != pair.reference.actions
        assert pair.student.traj_id != pair.reference.traj_id


@pytest.mark.parametrize("env", ["alfworld-easy", "webshop"])
def test_prompts_are_the_routers_and_targets_the_expert(env, tokenizer):
    """Token ids equal SMRC-SD's router rendering: context_only distils every turn with the same
    parts as smrc_sd (full reference + state + candidate where matched), smrc_sd only matched turns."""
    cfg = _cfg(env)
    router = make_router(cfg, tokenizer)
    checked = Counter()
    for pair in _pairs(cfg, 4):
        own = pair_turns(router, tokenizer, pair, pair.reference, cfg.method.matcher)
        for method in ("context_only", "smrc_sd"):
            trainer = TeacherRouter(method=method, matcher=cfg.method.matcher, parts=None, audit_matchers=(),
                                    rollout=cfg.rollout, tokenizer=tokenizer, max_chars=cfg.method.teacher_max_chars,
                                    seed=0)
            prompts = trainer([pair.student.traj, pair.reference.traj], step=0).teacher_prompts
            for t, turn in own:
                key = (pair.student.traj_id, t)
                if method == "context_only" or turn.kind == "teacher_matched":
                    assert list(turn.prompt_ids) == prompts[key], (method, t)
                    checked[turn.kind] += 1
                else:
                    assert key not in prompts
        for t, turn in own:
            want = tokenizer.encode(action_choice(pair.labels[t]), add_special_tokens=False) + [tokenizer.eos_token_id]
            assert list(turn.target_ids) == want
    assert checked["teacher_matched"] and checked["teacher_unmatched"], checked


@pytest.mark.parametrize("env", ["alfworld-easy", "webshop"])
def test_followed_turns_target_the_detoured_references_candidate(env, tokenizer):
    """Roles swapped: the plain expert is the student, the detoured winner the reference; only matched
    turns whose candidate is NOT the expert's own action are kept, and the target is that candidate."""
    cfg = _cfg(env)
    router = make_router(cfg, tokenizer)
    found = 0
    for pair in _pairs(cfg, 6):
        detours = {a for a, e in zip((t.action for t in pair.student.traj.turns), pair.labels, strict=True) if a != e}
        for turn in followed_turns(router, tokenizer, pair, cfg.method.matcher):
            target = tokenizer.decode(list(turn.target_ids))
            action = target.removeprefix("<action>").removesuffix("</action><|im_end|>")
            text = tokenizer.decode(list(turn.prompt_ids))
            assert turn.kind == "teacher_followed" and action in detours, (action, detours)
            assert CANDIDATE_PREFIX in text and action in text.split(CANDIDATE_PREFIX)[-1], text[-400:]
            found += 1
    assert found, "no detour of a winning detoured expert was at a state the plain expert also visited"


def test_other_task_reference_is_unmatched_and_mismatched_episodes_are_refused(tokenizer):
    cfg = _cfg("alfworld-easy")
    router = make_router(cfg, tokenizer)
    a, b = _pairs(cfg, 4)[:2]
    assert a.student.task_id != b.reference.task_id
    cross = pair_turns(router, tokenizer, a, b.reference, cfg.method.matcher)
    assert cross and all(t.kind == "teacher_unmatched" for _, t in cross)
    assert all(CANDIDATE_PREFIX not in tokenizer.decode(list(t.prompt_ids)) for _, t in cross)
    tasks = sample_tasks(cfg.env, "train", 3, seed=1)
    with pytest.raises(ValueError, match="expert episodes for 3 tasks"):
        teacher_turns(cfg, tokenizer, expert_episodes(cfg.env, tasks)[:2], tasks, random.Random(0), n=4)
    with pytest.raises(ValueError, match="replayed expert differs"):
        teacher_turns(cfg, tokenizer, expert_episodes(cfg.env, tasks)[::-1], tasks, random.Random(0), n=4)


@pytest.mark.parametrize("env", ["alfworld-easy", "webshop"])
def test_plain_rows_are_the_loops_prompts_and_unchanged_with_zero_fractions(env, tokenizer):
    """With every fraction 0 the SFT adds nothing, and the plain rows are exactly the prompts the
    rollout loop renders (the router's renderer with no block) for the expert's turns."""
    cfg = _cfg(env)
    tasks = sample_tasks(cfg.env, "train", 3, seed=2)
    episodes = expert_episodes(cfg.env, tasks)
    assert extra_turns(cfg, tokenizer, episodes, tasks, 100, random.Random(0)) == []
    rows = demo_rows(tokenizer, cfg.rollout, episodes, cfg.env.name)
    router = make_router(cfg, tokenizer)
    env_ = make_env(cfg.env)
    expected = []
    for task, episode in zip(tasks, episodes, strict=True):
        played, won = play(env_, task, None)
        assert won
        ref = Episode(to_trajectory(task, played, traj_id="e", group_id="g", won=won))
        assert ref.actions == [t.action for t in episode]
        for t, action in enumerate(ref.actions):
            response = tokenizer.encode(action_choice(action), add_special_tokens=False) + [tokenizer.eos_token_id]
            expected.append((router._render(ref, t, ""), response))
    assert rows == expected


def test_fractions_must_leave_plain_turns_the_majority():
    with pytest.raises(ValueError, match="plain expert turns must stay the majority"):
        _cfg("alfworld-easy", teacher_fraction=0.3, skill_fraction=0.2)
    assert _cfg("alfworld-easy", teacher_fraction=0.3, skill_fraction=0.1).sft.teacher_fraction == 0.3


def test_run_sft_mixes_teacher_turns_by_fraction(tmp_path):
    cfg = _cfg("alfworld-easy", teacher_fraction=0.25, num_tasks=6, epochs=1, batch_rows=64)
    base = build_model_from_env(cfg, tmp_path / "base", num_episodes=4)
    out = run_sft(cfg, str(base), tmp_path / "sft", minutes=5)
    summary = json.loads((out / "sft_summary.json").read_text())
    kinds = summary["rows_by_kind"]
    plain = kinds["plain"]
    teacher = round(0.25 * plain / 0.75)
    shown = kinds["teacher_matched"] + kinds.get("teacher_followed", 0)
    assert shown + kinds.get("teacher_unmatched", 0) + summary["dropped_longer_than_model"] == teacher
    assert shown == teacher - teacher // 2
    assert summary["rows"] == plain + teacher - summary["dropped_longer_than_model"]
    zero = run_sft(_cfg("alfworld-easy", num_tasks=6, epochs=1, batch_rows=64), str(base), tmp_path / "plain", minutes=5)
    assert json.loads((zero / "sft_summary.json").read_text())["rows_by_kind"] == {"plain": plain}


def test_run_sft_runs_its_planned_steps_and_a_time_cap_fails_instead_of_cutting_short(tmp_path):
    from deploy.laptop.sft import SFTTimeCapReached

    cfg = _cfg("alfworld-easy", num_tasks=6, epochs=2, batch_rows=64)
    base = build_model_from_env(cfg, tmp_path / "base", num_episodes=4)
    with pytest.raises(SFTTimeCapReached):
        run_sft(cfg, str(base), tmp_path / "cut", minutes=1e-9)
    assert not (tmp_path / "cut" / "sft_summary.json").exists()  # nothing saved that looks finished
    full = json.loads((run_sft(cfg, str(base), tmp_path / "full", minutes=60) / "sft_summary.json").read_text())
    assert full["stopped_by"] == "epochs" and full["optimizer_steps"] == full["planned_steps"]


def test_ability_record_is_strict_json_when_a_group_is_empty():
    """No followed states (or no mismatched ones) is a null figure in abilities.json, never NaN."""
    from deploy.testbed.abilities import TeacherGainDetail
    from deploy.testbed.types import AbilityFigure

    detail = TeacherGainDetail(figure=AbilityFigure(mean=float("nan"), lo=float("nan"), hi=float("nan"), n=0,
                                                    per_item=()),
                               matched=(0.5, 0.25), mismatched=(), tasks_used=1, student_matched=(-1.0, -2.0))
    record = json.loads(json.dumps(detail.to_json(), allow_nan=False))
    assert record["delta_matched"] == {"mean": 0.375, "lo": 0.25, "hi": 0.5, "n": 2}
    assert record["delta_mismatched"] == record["copy_gain_followed_states"] | {"n": 0} == {
        "mean": None, "lo": None, "hi": None, "n": 0}
    assert (record["mean"], record["n"]) == (None, 0)
