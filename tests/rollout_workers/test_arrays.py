"""Token ids and log-probs as arrays in the contracts (`rollout_workers.types`): they read like the
tuples they replaced, pickle as raw buffers, and trajectories archived as JSON lists still load."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from pydantic import ValidationError

from rollout_workers.types import Generation, LogProbs, TokenIds, Trajectory, Turn

# One line of trajectories/step_N.jsonl as the tuple contracts wrote it (ids and log-probs as JSON lists).
ARCHIVED = json.dumps({
    "task": {"env": "alfworld", "task_id": "t1", "task_type": "pick_and_place_simple", "split": "train",
             "instruction": "put a mug in cabinet.", "seed": 3},
    "group_id": "t1@3#a", "traj_id": "t1@3#a/0", "success": False, "score": 0.0, "task_score": None,
    "policy_version": 2, "skill_text": None, "end_reason": "step_limit", "end_detail": None,
    "skill_bank_version": 4,
    "turns": [{"prompt_ids": [5, 6, 150000], "response_ids": [7, 8], "sampler_logprobs": [-0.125, -2.5],
               "allowed_token_ids": [[7, 9], [8]], "response_text": "<action>look</action>", "action": "look",
               "env_action": "look", "action_valid": True, "invalid_reason": None, "observation": "o",
               "admissible_actions": ["look"], "next_observation": "n", "reward": 0.0, "signature": None}],
})


def test_archived_record_loads_into_arrays_and_writes_back_the_same_json():
    traj = Trajectory.model_validate_json(ARCHIVED)
    turn = traj.turns[0]
    assert isinstance(turn.prompt_ids, TokenIds) and turn.prompt_ids.array.dtype == np.int32
    assert isinstance(turn.sampler_logprobs, LogProbs) and turn.sampler_logprobs.array.dtype == np.float64
    assert turn.prompt_ids == (5, 6, 150000) and [7, 8] == turn.response_ids
    assert turn.sampler_logprobs == (-0.125, -2.5)
    record = json.loads(traj.model_dump_json())
    assert record["turns"][0]["prompt_ids"] == [5, 6, 150000]
    assert record["turns"][0]["sampler_logprobs"] == [-0.125, -2.5]
    assert Trajectory.model_validate_json(traj.model_dump_json()) == traj


def test_arrays_read_like_tuples():
    ids = TokenIds((3, 1, 4, 1, 5))
    assert len(ids) == 5 and ids[0] == 3 and type(ids[0]) is int and ids[-1] == 5
    assert ids[1:3] == (1, 4) and isinstance(ids[1:3], TokenIds)
    assert list(ids) == [3, 1, 4, 1, 5] and tuple(ids) == (3, 1, 4, 1, 5) and (*ids, 9)[-1] == 9
    assert ids.count(1) == 2 and ids.index(4) == 2 and 4 in ids
    assert ids != (3, 1, 4) and ids != TokenIds((3, 1, 4, 1, 6)) and ids != "31415"
    assert hash(ids) == hash(TokenIds([3, 1, 4, 1, 5])) == hash((3, 1, 4, 1, 5)) and (3, 1, 4, 1, 5) in {ids}
    assert not TokenIds(()) and bool(ids)
    with pytest.raises(ValueError, match="read-only"):
        ids.array[0] = 7


def test_arrays_do_not_alias_the_callers_array():
    source = np.array([1, 2, 3], dtype=np.int32)
    ids = TokenIds(source)
    source[0] = 9
    assert ids == (1, 2, 3) and source.flags.writeable


def test_contract_invariants_still_hold():
    with pytest.raises(ValidationError, match="align 1:1"):
        Turn(prompt_ids=(1,), response_ids=(2, 3), sampler_logprobs=(-0.1,), response_text="", action=None,
             action_valid=False, observation="", next_observation="")
    with pytest.raises(ValidationError, match="sequence of numbers"):
        Generation(token_ids="abc", logprobs=(), text="", finish_reason="stop")
    for bad in ([None, 2], [2**40]):  # a null or out-of-range id in an archive is bad data: ValueError
        with pytest.raises(ValueError, match="TokenIds needs numbers"):
            TokenIds(bad)
    with pytest.raises(ValidationError, match="prompt_ids"):
        Turn(prompt_ids=(None, 2), response_ids=(3,), sampler_logprobs=(-0.1,), response_text="", action=None,
             action_valid=False, observation="", next_observation="")


def test_a_pickled_turn_carries_raw_buffers():
    rng = np.random.default_rng(0)
    prompt, response = rng.integers(0, 150_000, 2500), rng.integers(0, 150_000, 200)
    turn = Turn(prompt_ids=prompt, response_ids=response, sampler_logprobs=-rng.random(200), response_text="x",
                action=None, action_valid=False, observation="o", next_observation="n")
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(turn, protocol=5, buffer_callback=buffers.append)  # what Ray does: out of band
    assert sorted(b.raw().nbytes for b in buffers) == [4 * 200, 8 * 200, 4 * 2500]
    assert len(blob) < 1500  # the rest of the turn: texts and small fields
    back = pickle.loads(blob, buffers=buffers)
    assert back == turn and back.prompt_ids == prompt.tolist()
    assert not back.prompt_ids.array.flags.writeable
