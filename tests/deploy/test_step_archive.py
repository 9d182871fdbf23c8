"""`deploy.step_archive`: the ranks' parts of a step's archive interleaved into step order by rank 0
(pure file IO, real trajectories)."""

from __future__ import annotations

import json

import pytest

from deploy.step_archive import merge_parts, part_path, write_part
from rollout_workers.types import Trajectory
from tests.rollout_workers.test_arrays import ARCHIVED


def _episodes(n: int) -> list[Trajectory]:
    base = json.loads(ARCHIVED)
    return [Trajectory.model_validate(dict(base, traj_id=f"t1@3#a/{i}")) for i in range(n)]


def test_parts_interleave_into_step_order(tmp_path):
    episodes = _episodes(5)
    keepers = {"t1@3#a/0": 1, "t1@3#a/1": 0, "t1@3#a/2": 1, "t1@3#a/3": 2, "t1@3#a/4": 0}
    archive = tmp_path / "trajectories" / "step_000001.jsonl"
    for rank in range(3):
        write_part(archive, [t for t in episodes if keepers[t.traj_id] == rank], rank=rank, world_size=3)
    assert not archive.exists() and part_path(archive, 2).name == "step_000001.jsonl.rank2"
    merge_parts(archive, [t.traj_id for t in episodes], keepers, world_size=3)
    assert [Trajectory.model_validate_json(line) for line in archive.read_text().splitlines()] == episodes
    assert sorted(p.name for p in archive.parent.iterdir()) == ["step_000001.jsonl"]  # the parts are gone


def test_one_rank_writes_the_archive_itself(tmp_path):
    archive = tmp_path / "step_000002.jsonl"
    assert write_part(archive, _episodes(2), rank=0, world_size=1) == archive
    assert merge_parts(archive, ["t1@3#a/0", "t1@3#a/1"], {"t1@3#a/0": 0, "t1@3#a/1": 0}, world_size=1) == archive
    assert len(archive.read_text().splitlines()) == 2


def test_a_part_that_misses_an_episode_is_named(tmp_path):
    episodes = _episodes(3)
    keepers = {"t1@3#a/0": 0, "t1@3#a/1": 1, "t1@3#a/2": 1}
    archive = tmp_path / "step_000003.jsonl"
    write_part(archive, episodes[:1], rank=0, world_size=2)
    write_part(archive, episodes[1:2], rank=1, world_size=2)  # one of its two
    with pytest.raises(ValueError, match=r"step_000003\.jsonl\.rank1: 1 lines for the 2 episodes rank 1 keeps"):
        merge_parts(archive, [t.traj_id for t in episodes], keepers, world_size=2)
    assert not archive.exists()
