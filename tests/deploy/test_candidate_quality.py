"""Candidate quality on a tiny archived run built from the embedded household's expert (no Ray, no
model): a reference that leaves the state where it takes the goal object and comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.analysis.candidate_quality import format_summary, run_candidate_quality
from deploy.config import TrainConfig
from envs.registry import make_env
from envs.tasks import eval_tasks
from envs.types import TaskSpec
from rollout_workers.types import Trajectory, Turn
from routing.matching import DEFAULT_CANDIDATE

REPO = Path(__file__).resolve().parents[2]


def _episode(env, task: TaskSpec, *, detour: bool, traj_id: str) -> Trajectory:
    """The expert's episode; with `detour`, right before the expert's first `take X from L` the
    agent goes to another receptacle and back to L (so the reference visits that state twice)."""
    obs, info = env.reset(options={"task": task})
    turns, won, done, planned = [], False, False, []
    while not done:
        admissible = tuple(info["admissible_commands"])
        action = planned.pop(0) if planned else env.expert_action()
        if detour and action.startswith("take "):
            here = action.rsplit(" from ", 1)[1]
            away = next(a for a in admissible if a.startswith("go to ") and a != f"go to {here}")
            planned, action, detour = [f"go to {here}"], away, False
        nxt, _, won, truncated, info = env.step(action)
        turns.append(Turn(prompt_ids=(1,), response_ids=(2,), sampler_logprobs=(0.0,), response_text="",
                          action=action, env_action=action, action_valid=True, observation=obs,
                          next_observation=nxt, admissible_actions=admissible))
        obs, done = nxt, won or truncated
    return Trajectory(task=task, group_id=traj_id, traj_id=traj_id, turns=tuple(turns), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit")


def _fake_run(run_dir: Path) -> tuple[Trajectory, Trajectory]:
    """Step 1: the detour reference alone (no reference for it); step 2: the expert's episode of the
    same task, routed onto the buffered reference."""
    cfg = TrainConfig.model_validate({"env": {"task_types": ["pick_and_place_simple"]}})
    (run_dir / "config.resolved.json").write_text(cfg.model_dump_json())
    env = make_env(cfg.env)
    task = eval_tasks(cfg.env, "train", 1)[0]
    reference = _episode(env, task, detour=True, traj_id="ref")
    student = _episode(env, task, detour=False, traj_id="student")
    (run_dir / "trajectories").mkdir()
    for n, traj in ((1, reference), (2, student)):
        (run_dir / "trajectories" / f"step_{n:06d}.jsonl").write_text(traj.model_dump_json() + "\n")
    return reference, student


def test_first_visit_candidate_is_the_detour(tmp_path: Path) -> None:
    reference, student = _fake_run(tmp_path)
    assert reference.success and student.success and len(reference.turns) == len(student.turns) + 2
    result = run_candidate_quality(tmp_path)

    assert result.steps == [1, 2] and result.turns_with_reference == len(student.turns)
    n = len(student.turns)  # every state of the expert's episode is one the reference visits
    s = result.matchers["structured"]
    # first visit: at the take-state the candidate is the detour's "go to ..."; elsewhere the expert's
    assert {r: (q.matched_turns, q.expert_equal) for r, q in s.common.items()} == {
        "first_visit": (n, n - 1), "last_visit": (n, n), "loop_erased": (n, n)}
    assert s.rules["first_visit"] == s.common["first_visit"]
    # history: the action prefixes agree only up to the detour, identical under every rule
    h = result.matchers["history"].rules
    take = next(t for t, turn in enumerate(student.turns) if turn.action.startswith("take "))
    assert {(q.matched_turns, q.expert_equal) for q in h.values()} == {(take + 1, take)}

    lines = format_summary(result)
    assert lines[-1] == f"candidate = expert action: first-visit {(n - 1) / n:.1%}, last-visit 100.0%, loop-erased 100.0%"
    data = json.loads((tmp_path / "analysis" / "candidate_quality.json").read_text())
    assert data["summary"][-1] == lines[-1]
    assert data["matchers"]["structured"]["common"]["first_visit"]["expert_equal"] == n - 1
    assert (tmp_path / "analysis" / "candidate_quality.png").stat().st_size > 0


def test_cli_prints_the_line_last_and_refuses_a_run_without_trajectories(tmp_path: Path) -> None:
    _fake_run(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "deploy", "analyze", "candidate-quality", "--run"]
    ok = subprocess.run([*cmd, str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines()[-1].startswith("candidate = expert action: first-visit ")
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([*cmd, str(empty)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "trajectories" in bad.stderr


def test_method_candidate_config() -> None:
    assert TrainConfig().method.candidate == DEFAULT_CANDIDATE
    assert TrainConfig.model_validate({"method": {"candidate": "loop_erased"}}).method.candidate == "loop_erased"
    with pytest.raises(ValueError, match="candidate"):
        TrainConfig.model_validate({"method": {"candidate": "middle_visit"}})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    tiny = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64, max_position_embeddings=2048)
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("m") / "model",
                                                          ["go to desk 1", "look"] * 20, tiny))


@pytest.mark.parametrize("rule", ["first_visit", "last_visit", "loop_erased"])
def test_teacher_router_shows_the_rules_candidate(tmp_path: Path, tokenizer, rule: str) -> None:
    from deploy.stages.smrc_sd import TeacherRouter
    from rollout_workers.config import RolloutConfig

    reference, student = _fake_run(tmp_path)
    router = TeacherRouter(method="smrc_sd", matcher="structured", parts=frozenset({"candidate_action"}),
                           audit_matchers=(), rollout=RolloutConfig(use_think=False), tokenizer=tokenizer,
                           max_chars=4000, seed=0, candidate=rule)  # type: ignore[arg-type]
    router([reference], step=1)  # no reference for it; it enters the success buffer
    prompts = router([student], step=2).teacher_prompts
    take = next(t for t, turn in enumerate(student.turns) if turn.action.startswith("take "))
    detour = reference.turns[take].action  # the reference's first action at the take-state
    shown = tokenizer.decode(prompts[("student", take)])
    expected = detour if rule == "first_visit" else student.turns[take].action
    assert detour.startswith("go to ") and f"reference): '{expected}'" in shown
