"""Avg@k / Pass@k / standard error, hand-computed."""

import math

import pytest

from deploy.evaluation import paired_difference, pass_at_k, summarize_eval
from deploy.metrics import rollout_metrics
from envs.health import repeated_ngram_ratio
from envs.types import TaskSpec
from rollout_workers.types import Trajectory, Turn


def _traj(task_id: str, task_type: str, success: bool, n_turns: int = 1, end="won") -> Trajectory:
    task = TaskSpec(env="alfworld", task_id=task_id, task_type=task_type, split="valid_unseen",
                    instruction="put a mug in desk.", seed=0)
    turn = Turn(prompt_ids=(1, 2), response_ids=(3, 4, 3, 4, 3, 4), sampler_logprobs=(-0.1,) * 6,
                response_text="<action>look</action>", action="look", action_valid=True,
                observation="o", next_observation="o2")
    return Trajectory(task=task, group_id=task_id, traj_id=f"{task_id}-{success}", turns=(turn,) * n_turns,
                      success=success, score=10.0 * success, policy_version=3,
                      end_reason=end if success else "step_limit")


def test_avg_pass_and_se_by_hand():
    # task a: 2/2, task b: 1/2, task c: 0/2 -> per-task means 1, .5, 0
    trajs = [_traj("a", "pick", True), _traj("a", "pick", True), _traj("b", "pick", True),
             _traj("b", "pick", False), _traj("c", "look", False), _traj("c", "look", False)]
    r = summarize_eval(trajs, label="x", split="valid_unseen", k=2, temperature=0.4)
    assert r.avg_at_k == pytest.approx(0.5)
    assert r.avg_at_k_se == pytest.approx(math.sqrt(0.25 / 3))  # sample var of (1,.5,0) = .25
    assert r.pass_at_k == pytest.approx(2 / 3)
    assert r.per_task_type["pick"].avg_at_k == pytest.approx(0.75)
    assert r.per_task_type["look"].pass_at_k == 0.0
    assert r.end_reasons == {"won": 3, "step_limit": 3}


def test_paired_difference_by_hand():
    before = summarize_eval([_traj("a", "p", False), _traj("a", "p", False), _traj("b", "p", True),
                             _traj("b", "p", False)], label="b", split="s", k=2, temperature=0.4)
    after = summarize_eval([_traj("a", "p", True), _traj("a", "p", False), _traj("b", "p", True),
                            _traj("b", "p", True)], label="a", split="s", k=2, temperature=0.4)
    assert before.per_task == {"a": 0.0, "b": 0.5}
    d = paired_difference(before, after)  # per-task diffs (.5, .5): mean .5, no spread
    assert d.mean == pytest.approx(0.5) and d.se == pytest.approx(0.0) and d.num_tasks == 2
    with pytest.raises(ValueError, match="same non-empty task set"):
        paired_difference(before, summarize_eval([_traj("c", "p", True)], label="c", split="s", k=1,
                                                 temperature=0.4))


def test_eval_rejects_uneven_samples():
    with pytest.raises(ValueError, match="expected 2 samples"):
        summarize_eval([_traj("a", "pick", True)], label="x", split="s", k=2, temperature=0.4)


def test_unbiased_pass_at_k():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - (3 * 2) / (5 * 4))


def test_rollout_metrics_and_repetition():
    assert repeated_ngram_ratio([1, 2, 3, 4]) == 0.0
    assert repeated_ngram_ratio([3, 4, 3, 4, 3, 4]) == pytest.approx(1 - 2 / 3)
    m = rollout_metrics([_traj("a", "pick", True, n_turns=2), _traj("b", "pick", False, n_turns=4)])
    assert m["success_rate"] == 0.5 and m["reward_mean"] == 5.0
    assert m["episode_len_mean"] == 3.0 and m["response_len_mean"] == 6.0


def test_eval_records_response_length_and_repeated_4gram_ratio_by_hand():
    task = TaskSpec(env="alfworld", task_id="a", task_type="pick", split="valid_seen", instruction="i", seed=0)

    def turn(ids):
        return Turn(prompt_ids=(1,), response_ids=tuple(ids), sampler_logprobs=(-0.1,) * len(ids),
                    response_text="t", action="look", action_valid=True, observation="o", next_observation="o2")

    # (3,4,3,4,3,4): 4-grams 3434, 4343, 3434 -> 1 of 3 repeats an earlier one; (5,6,7,8,9): 2 distinct;
    # (1,2): no 4-gram -> 0. Mean length (6 + 5 + 2) / 3; mean ratio (1/3 + 0 + 0) / 3.
    t1 = Trajectory(task=task, group_id="a", traj_id="a0", turns=(turn([3, 4, 3, 4, 3, 4]), turn([5, 6, 7, 8, 9])),
                    success=True, score=10.0, policy_version=1, end_reason="won")
    t2 = Trajectory(task=task, group_id="a", traj_id="a1", turns=(turn([1, 2]),), success=False, score=0.0,
                    policy_version=1, end_reason="step_limit")
    r = summarize_eval([t1, t2], label="x", split="valid_seen", k=2, temperature=0.4)
    assert r.response_len_mean == pytest.approx(13 / 3)
    assert r.rep4gram_ratio == pytest.approx((1 / 3) / 3)
    assert r.split == "valid_seen"
    # the same definition as the per-step rollout metric
    m = rollout_metrics([t1, t2])
    assert (m["response_len_mean"], m["rep4gram_ratio"]) == pytest.approx((r.response_len_mean, r.rep4gram_ratio))
