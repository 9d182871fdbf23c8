"""Replay audit on a fake run dir built from the embedded env's expert (no Ray, no model)."""

import json
import random

from deploy.analysis.replay_audit import format_summary, load_env_config, run_replay_audit
from deploy.config import TrainConfig
from envs.registry import make_env
from envs.tasks import eval_tasks
from rollout_workers.types import Trajectory, Turn


def _episode(env, task, *, detour: int, rng: random.Random, group_id: str, traj_id: str) -> Trajectory:
    obs, info = env.reset(options={"task": task})
    turns, won, done = [], False, False
    while not done:
        admissible = tuple(info["admissible_commands"])
        if len(turns) < detour:
            action = rng.choice([a for a in admissible if a != "help"])
        else:
            action = env.expert_action()
        nxt, _, won, truncated, info = env.step(action)
        turns.append(Turn(prompt_ids=(1,), response_ids=(2,), sampler_logprobs=(0.0,), response_text="",
                          action=action, env_action=action, action_valid=True, observation=obs,
                          next_observation=nxt, admissible_actions=admissible))
        obs, done = nxt, won or truncated
    return Trajectory(task=task, group_id=group_id, traj_id=traj_id, turns=tuple(turns), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit")


def _fake_run(tmp_path, num_tasks=4):
    cfg = TrainConfig()
    (tmp_path / "config.resolved.json").write_text(cfg.model_dump_json())
    env_cfg = cfg.env
    env, rng = make_env(env_cfg), random.Random(7)
    tasks = eval_tasks(env_cfg, "train", num_tasks)
    (tmp_path / "trajectories").mkdir()
    step1 = []
    for i, task in enumerate(tasks):
        g = f"g{i}"
        step1 += [_episode(env, task, detour=0, rng=rng, group_id=g, traj_id=f"{g}-0"),
                  _episode(env, task, detour=2, rng=rng, group_id=g, traj_id=f"{g}-1"),
                  _episode(env, task, detour=0, rng=rng, group_id=g, traj_id=f"{g}-2")]
    # step 2: a lone detour rollout of task 0 (its reference comes from the success buffer)
    step2 = [_episode(env, tasks[0], detour=2, rng=rng, group_id="s2g0", traj_id="s2g0-0")]
    for n, trajs in ((1, step1), (2, step2)):
        (tmp_path / "trajectories" / f"step_{n:06d}.jsonl").write_text(
            "".join(t.model_dump_json() + "\n" for t in trajs))
    return env_cfg, step1 + step2


def test_replay_audit_on_expert_run(tmp_path):
    _, trajs = _fake_run(tmp_path)
    assert all(t.success for t in trajs if t.traj_id.endswith(("-0", "-2")))
    env_cfg = load_env_config(tmp_path)
    result = run_replay_audit(tmp_path, env_cfg=env_cfg)

    assert result.steps == [1, 2]
    assert result.total_turns == sum(len(t.turns) for t in trajs)
    assert result.turns_with_reference == result.total_turns  # every task has a success
    for audit in result.matchers.values():
        assert 0.0 <= audit.coverage <= 1.0
        assert 0 <= audit.replay_success <= audit.replayed == audit.matched_turns
    s = result.matchers["structured"]
    assert s.replayed > 0 and s.replay_success == s.replayed, s  # 100% on the embedded env
    for p in result.pairs:
        assert p.reproduction is None or 0.0 <= p.reproduction <= 1.0
        assert p.candidate_agreement is None or 0.0 <= p.candidate_agreement <= 1.0

    out = tmp_path / "analysis"
    assert (out / "replay_audit.json").is_file() and (out / "replay_audit.png").stat().st_size > 0
    data = json.loads((out / "replay_audit.json").read_text())
    assert data["matchers"]["structured"]["replay_success"] == s.replay_success

    lines = format_summary(result)
    assert lines[-1] == f"structured replay success: {s.replay_success}/{s.replayed}"
    print("\n".join(lines))


def test_max_turns_caps_replays_deterministically(tmp_path):
    env_cfg, _ = _fake_run(tmp_path, num_tasks=2)
    a = run_replay_audit(tmp_path, env_cfg=env_cfg, out_dir=tmp_path / "a", max_turns=5)
    b = run_replay_audit(tmp_path, env_cfg=env_cfg, out_dir=tmp_path / "b", max_turns=5)
    assert a.replayed_turns == 5 < a.matched_turns_any
    assert a.model_dump(exclude={"json_path", "png_path"}) == b.model_dump(exclude={"json_path", "png_path"})
    assert format_summary(a)[-1].startswith("structured replay success: ")
    assert (tmp_path / "a" / "replay_audit.png").is_file()


def test_failed_replays_are_listed_with_their_context(tmp_path, monkeypatch):
    import deploy.analysis.replay_audit as audit_mod

    _fake_run(tmp_path)
    env_cfg = load_env_config(tmp_path)
    ok = run_replay_audit(tmp_path, env_cfg=env_cfg, out_dir=tmp_path / "ok")
    failed = sum(a.replayed - a.replay_success for a in ok.matchers.values())
    assert sum(len(f.matchers) for f in ok.failed_replays) == failed  # the observation matcher's, here
    assert not any("structured" in f.matchers for f in ok.failed_replays)
    monkeypatch.setattr(audit_mod, "replay_candidate", lambda env, task, prefix, suffix: False)
    result = run_replay_audit(tmp_path, env_cfg=env_cfg, out_dir=tmp_path / "bad")
    s = result.matchers["structured"]
    assert s.replay_success == 0 and s.replayed > 0
    listed = result.failed_replays
    for m, a in result.matchers.items():  # every failure, or at least the first MAX_FAILED_LISTED of each matcher
        assert min(a.replayed, audit_mod.MAX_FAILED_LISTED) <= sum(m in f.matchers for f in listed) <= a.replayed
    trajs = {json.loads(line)["traj_id"]: json.loads(line) for p in sorted((tmp_path / "trajectories").glob("*.jsonl"))
             for line in p.read_text().splitlines()}
    for f in listed:
        actions = [turn["env_action"] for turn in trajs[f.traj_id]["turns"]]
        assert f.student_actions == actions[max(0, f.t - audit_mod.FAILED_CONTEXT):f.t]
        assert len(f.reference_suffix) <= audit_mod.FAILED_CONTEXT and f.task_id == trajs[f.traj_id]["task"]["task_id"]
    saved = json.loads((tmp_path / "bad" / "replay_audit.json").read_text())
    assert len(saved["failed_replays"]) == len(listed)


def _play(env, task, actions: list[str], *, group_id: str, traj_id: str) -> Trajectory:
    obs, info = env.reset(options={"task": task})
    turns, won = [], False
    for action in actions:
        admissible = tuple(info["admissible_commands"])
        nxt, _, won, truncated, info = env.step(action)
        turns.append(Turn(prompt_ids=(1,), response_ids=(2,), sampler_logprobs=(0.0,), response_text="",
                          action=action, env_action=action, action_valid=True, observation=obs,
                          next_observation=nxt, admissible_actions=admissible))
        obs = nxt
        if won or truncated:
            break
    return Trajectory(task=task, group_id=group_id, traj_id=traj_id, turns=tuple(turns), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit")


def test_a_student_holding_another_instance_replays_the_bound_suffix(tmp_path):
    """The grid's only failed replays: two dishsponges lie on sinkbasin 1, the reference took
    dishsponge 1 and the student dishsponge 2. The signatures match (the inventory is the class),
    so the candidate and the replayed suffix must name the student's dishsponge 2."""
    from rollout_workers.episode import Episode
    from routing.matching import route

    cfg = TrainConfig()
    (tmp_path / "config.resolved.json").write_text(cfg.model_dump_json())
    env = make_env(cfg.env)
    [task] = [t for t in eval_tasks(cfg.env, "train", 20) if t.task_id == "train/pick_clean_then_place_in_recep-00008"]
    env.reset(options={"task": task})
    expert = []
    while not expert or not env.step(expert[-1])[2]:
        expert.append(env.expert_action())
    assert expert[:2] == ["go to sinkbasin 1", "take dishsponge 1 from sinkbasin 1"], expert
    reference = _play(env, task, expert, group_id="g", traj_id="ref")
    student = _play(env, task, ["go to sinkbasin 1", "take dishsponge 2 from sinkbasin 1", "look", "look"],
                    group_id="g", traj_id="student")
    assert reference.success and not student.success
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "step_000001.jsonl").write_text(
        "".join(t.model_dump_json() + "\n" for t in (reference, student)))

    decisions = route("structured", Episode(student).trace(), Episode(reference).trace())
    assert decisions[2].ref_position == 2 and decisions[2].candidate_action == expert[2].replace("dishsponge 1", "dishsponge 2")
    assert "dishsponge 2" in decisions[2].candidate_action
    result = run_replay_audit(tmp_path, env_cfg=cfg.env, matchers=("structured",))
    s = result.matchers["structured"]
    assert s.replayed >= 3 and s.replay_success == s.replayed, result.failed_replays
