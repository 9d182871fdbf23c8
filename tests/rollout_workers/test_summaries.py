"""Trajectories split into the driver's summaries and the learners' token packs
(`rollout_workers.summaries.summarize` / `join`): the split loses nothing, the summary holds no token
array, and the packs travel through pickle as raw buffers."""

from __future__ import annotations

import json
import pickle

import pytest

from envs.health import repeated_ngram_ratio
from rollout_workers.summaries import join, rep4gram_ratio, summarize, trajectory_from_json
from rollout_workers.types import TokenPack, Trajectory, TrajectorySummary, TurnSummary
from tests.rollout_workers.test_arrays import ARCHIVED


def _episodes() -> list[Trajectory]:
    base = json.loads(ARCHIVED)
    constrained = Trajectory.model_validate(base)
    free = dict(base, traj_id="t1@3#a/1", success=True, score=10.0, turns=[
        dict(base["turns"][0], allowed_token_ids=None, response_ids=[3, 4, 3, 4, 3, 4],
             sampler_logprobs=[-0.5] * 6),
        dict(base["turns"][0], prompt_ids=[], response_ids=[], sampler_logprobs=[], allowed_token_ids=None)])
    empty = dict(base, traj_id="t1@3#a/2", turns=[], end_reason="env_error", end_detail="crashed")
    return [constrained, Trajectory.model_validate(free), Trajectory.model_validate(empty)]


def test_summary_and_pack_join_back_to_the_same_trajectories():
    episodes = _episodes()
    summaries, pack = summarize(episodes)
    joined = join(summaries, [pack])
    assert joined == episodes
    assert [t.model_dump_json() for t in joined] == [t.model_dump_json() for t in episodes]
    assert joined[0].turns[0].allowed_token_ids == ((7, 9), (8,))
    shuffled = join([summaries[2], summaries[0]], [pickle.loads(pickle.dumps(pack, protocol=5))])
    assert shuffled == [episodes[2], episodes[0]]


def test_a_summary_holds_counts_and_text_but_no_token_array():
    summaries, _ = summarize(_episodes())
    turn = summaries[1].turns[0]
    assert isinstance(summaries[1], TrajectorySummary) and isinstance(turn, TurnSummary)
    assert (turn.num_prompt_tokens, turn.num_response_tokens) == (3, 6)
    assert turn.rep4gram_ratio == pytest.approx(repeated_ngram_ratio([3, 4, 3, 4, 3, 4])) == pytest.approx(1 / 3)
    assert turn.observation == "o" and turn.action == "look" and summaries[1].score == 10.0
    assert summaries[2].infrastructure_failure and summaries[2].turns == ()
    for name in ("prompt_ids", "response_ids", "sampler_logprobs", "allowed_token_ids"):
        assert not hasattr(turn, name)
    assert len(pickle.dumps(summaries)) < 3000


def test_full_turns_read_the_same_counts_as_their_summaries():
    episodes = _episodes()
    summaries, _ = summarize(episodes)
    for full, summary in zip(episodes, summaries):
        for a, b in zip(full.turns, summary.turns, strict=True):
            assert (a.num_prompt_tokens, a.num_response_tokens, rep4gram_ratio(a)) == \
                (b.num_prompt_tokens, b.num_response_tokens, rep4gram_ratio(b))


def test_an_episode_no_pack_holds_is_named():
    episodes = _episodes()
    summaries, _ = summarize(episodes[:1])
    _, other = summarize(episodes[1:])
    with pytest.raises(ValueError, match=r"t1@3#a/0"):
        join(summaries, [other])


def test_a_pack_ships_its_arrays_out_of_band():
    _, pack = summarize(_episodes())
    buffers = []
    pickle.dumps(pack, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) >= 3
    assert isinstance(pickle.loads(pickle.dumps(pack)), TokenPack)


def test_router_checkpoints_of_either_form_load():
    episodes = _episodes()
    summaries, _ = summarize(episodes)
    assert trajectory_from_json(episodes[0].model_dump_json()) == episodes[0]  # an older checkpoint's
    loaded = trajectory_from_json(summaries[1].model_dump_json())
    assert isinstance(loaded, TrajectorySummary) and loaded == summaries[1]
