"""Episodes that end because of the system (env crash, prompt over budget) never train GRPO as
policy failures: one rule (`split_infrastructure_failures`) for GRPO groups, routing and UniSkill."""

from __future__ import annotations

import logging

import torch

from deploy.trainer import Trainer
from envs.types import TaskSpec
from learner.algos import grpo_advantages
from learner.batch import rows_from_trajectories
from rollout_workers.types import INFRASTRUCTURE_FAILURES, Trajectory, Turn, split_infrastructure_failures


def _traj(i: int, end: str, score: float, detail: str | None = None) -> Trajectory:
    turn = Turn(prompt_ids=(1, 2), response_ids=(3,), sampler_logprobs=(-0.5,), response_text="look",
                action="look", action_valid=True, observation="o", next_observation="n")
    task = TaskSpec(task_id="t0", env="alfworld", task_type="pick_and_place", split="train",
                    instruction="put a mug in the sink", seed=0)
    return Trajectory(task=task, group_id="g0", traj_id=f"g0/{i}", turns=(turn,), success=score > 0,
                      score=score, policy_version=0, end_reason=end, end_detail=detail)


def test_the_rule_names_exactly_the_system_causes():
    assert INFRASTRUCTURE_FAILURES == {"env_error", "prompt_too_long"}
    trajs = [_traj(0, "won", 10.0), _traj(1, "env_error", 0.0, "turn 1: RuntimeError: engine died"),
             _traj(2, "step_limit", 0.0), _traj(3, "prompt_too_long", 0.0, "turn 5: prompt of 2100 tokens"),
             _traj(4, "ended", 0.0)]
    kept, failed = split_infrastructure_failures(trajs)
    assert [t.traj_id for t in kept] == ["g0/0", "g0/2", "g0/4"]
    assert [t.traj_id for t in failed] == ["g0/1", "g0/3"]


def test_excluded_episodes_leave_the_group_statistics_and_are_logged(caplog):
    trajs = [_traj(0, "won", 10.0), _traj(1, "env_error", 0.0, "turn 1: RuntimeError: engine died"),
             _traj(2, "step_limit", 0.0), _traj(3, "prompt_too_long", 0.0, "turn 5: prompt of 2100 tokens")]
    with caplog.at_level(logging.WARNING, logger="deploy.trainer"):
        played = Trainer.exclude_infrastructure_failures(trajs, step=7)
    rows = rows_from_trajectories(played)
    assert {r.traj_id for r in rows} == {"g0/0", "g0/2"}
    adv = grpo_advantages(torch.tensor([r.episode_score for r in rows]), torch.zeros(len(rows), dtype=torch.long),
                          torch.arange(len(rows)))
    # a success against one real failure: +-1/sqrt(2); counting the two infrastructure failures as
    # failures would have given the success +1.5 and each failure -0.5
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]) / 2 ** 0.5, atol=1e-5, rtol=0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "step 7: episode g0/1 (task t0) ended with env_error (turn 1: RuntimeError: engine died)" in messages[0]
    assert "prompt_too_long (turn 5: prompt of 2100 tokens)" in messages[1]
