"""`learner.sharding`: sort by length, stride by rank (or deal by episode), pad to equal count (pure, no model)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.sharding import episode_owners, owned_rows, shard_micro_batches
from learner.teacher_pass import teacher_chunks


def all_ranks(lengths, rows, world_size, micro, shared=None):
    return [
        shard_micro_batches(lengths, rows, rank=r, world_size=world_size, micro_rows=micro, shared=shared)
        for r in range(world_size)
    ]


def real_rows(chunks) -> list[int]:
    return [i for idx, real in chunks if real for i in idx.tolist()]


shapes = st.tuples(
    st.lists(st.integers(1, 9), min_size=1, max_size=30),  # row lengths (ties are common)
    st.integers(1, 5),  # world size
    st.integers(1, 4),  # micro-batch rows
    st.randoms(use_true_random=False),
)


@settings(max_examples=200, deadline=None)
@given(shapes)
def test_every_row_owned_once_equal_counts_length_ordered(case):
    lengths_list, world, micro, rnd = case
    lengths = torch.tensor(lengths_list)
    n = len(lengths_list)
    rows = torch.tensor(rnd.sample(range(n), rnd.randint(1, n)))  # any subset, any order
    per_rank = all_ranks(lengths, rows, world, micro)
    owned = [real_rows(c) for c in per_rank]
    # every row owned by exactly one rank
    assert sorted(i for o in owned for i in o) == sorted(rows.tolist())
    # equal micro-batch counts after padding, the documented count
    counts = {len(c) for c in per_rank}
    assert counts == {math.ceil(math.ceil(len(rows) / world) / micro)}
    shortest = min(rows.tolist(), key=lambda i: (lengths_list[i], rows.tolist().index(i)))
    for chunks in per_rank:
        reals = [real for _, real in chunks]
        assert reals == sorted(reals, reverse=True)  # padding only at the end
        for idx, real in chunks:
            assert 1 <= len(idx) <= micro
            if not real:
                assert idx.tolist() == [shortest]
    # length ordering: the sorted order, strided by rank
    order = sorted(rows.tolist(), key=lambda i: lengths_list[i])  # Python's sort is stable
    for r, o in enumerate(owned):
        assert o == order[r::world]
        assert [lengths_list[i] for i in o] == sorted(lengths_list[i] for i in o)


def test_micro_batches_group_similar_lengths():
    lengths = torch.tensor([9, 1, 8, 2, 7, 3, 6, 4])
    chunks = shard_micro_batches(lengths, torch.arange(8), rank=0, world_size=1, micro_rows=2)
    assert [lengths[idx].tolist() for idx, _ in chunks] == [[1, 2], [3, 4], [6, 7], [8, 9]]
    two = all_ranks(lengths, torch.arange(8), 2, 2)
    assert [[lengths[idx].tolist() for idx, _ in c] for c in two] == [[[1, 3], [6, 8]], [[2, 4], [7, 9]]]


def test_fewer_rows_than_ranks_pads_the_empty_ranks():
    lengths = torch.tensor([5, 3, 4])
    per_rank = all_ranks(lengths, torch.tensor([0]), 3, 2)
    assert [[(idx.tolist(), real) for idx, real in c] for c in per_rank] == [
        [([0], True)],
        [([0], False)],
        [([0], False)],
    ]


def test_shared_rows_go_to_every_rank():
    lengths = torch.tensor([4, 1, 9, 2, 8, 3, 7])
    shared, rows = torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5, 6])
    per_rank = all_ranks(lengths, rows, 2, 3, shared=shared)
    count = math.ceil((2 + math.ceil(5 / 2)) / 3)
    assert {len(c) for c in per_rank} == {count}
    owned = [real_rows(c) for c in per_rank]
    for o in owned:
        assert sorted(set(o) & {0, 1}) == [0, 1] and len(o) == len(set(o))
        assert [lengths[i].item() for i in o] == sorted(lengths[i].item() for i in o)
    assert sorted(i for o in owned for i in o if i not in (0, 1)) == rows.tolist()
    # one rank: exactly a stable length-sort of all rows
    (alone,) = all_ranks(lengths, rows, 1, 3, shared=shared)
    everything = torch.cat([shared, rows])
    expected = everything[torch.argsort(lengths[everything], stable=True)]
    assert torch.equal(torch.cat([idx for idx, _ in alone]), expected)


def test_no_rows_no_micro_batches():
    empty = torch.zeros(0, dtype=torch.long)
    assert shard_micro_batches(torch.tensor([3, 4]), empty, rank=1, world_size=2, micro_rows=2) == []


@pytest.mark.parametrize("world", [1, 2, 3])
def test_owned_rows_partition_the_batch(world):
    lengths = torch.randint(1, 20, (17,), generator=torch.Generator().manual_seed(0))
    minis = list(torch.randperm(17, generator=torch.Generator().manual_seed(1)).split(5))
    masks = [owned_rows(lengths, minis, rank=r, world_size=world, micro_rows=2) for r in range(world)]
    assert torch.equal(torch.stack(masks).sum(0), torch.ones(17, dtype=torch.long))


def test_teacher_chunks_pad_a_rank_without_teacher_rows():
    lengths = torch.tensor([5, 3, 4])
    mine = [torch.tensor([0, 1, 2]), torch.zeros(0, dtype=torch.long)]
    r0 = teacher_chunks(lengths, mine, rank=0, micro_rows=2)
    r1 = teacher_chunks(lengths, mine, rank=1, micro_rows=2)
    assert [(i.tolist(), real) for i, real in r0] == [([1, 2], True), ([0], True)]  # sorted by length
    assert [(i.tolist(), real) for i, real in r1] == [([1], False), ([1], False)]  # owning none: the shortest pads


def test_teacher_chunks_pack_by_the_token_budget():
    lengths = torch.tensor([10, 2, 3, 9, 4, 30])
    mine = [torch.tensor([0, 1, 2, 5]), torch.tensor([3, 4])]
    r0 = teacher_chunks(lengths, mine, rank=0, micro_rows=8, max_tokens=20)
    r1 = teacher_chunks(lengths, mine, rank=1, micro_rows=8, max_tokens=20)
    assert [(i.tolist(), real) for i, real in r0] == [([1, 2], True), ([0], True), ([5], True)]
    assert [(i.tolist(), real) for i, real in r1] == [([4, 3], True), ([4], False), ([4], False)]  # its own shortest pads


def test_episodes_are_cut_into_runs_of_about_equal_tokens():
    episode = torch.tensor([0, 0, 1, 2, 2, 2, 3, 4])
    lengths = torch.tensor([5, 5, 9, 4, 4, 4, 3, 1])  # episode tokens 10, 9, 12, 3, 1 of 35
    owner = episode_owners(lengths, episode, 2)
    # midpoints 5, 14.5, 25, 32.5, 34.5: below 17.5 -> rank 0, above -> rank 1
    assert owner.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert [int(lengths[owner == r].sum()) for r in range(2)] == [19, 16]
    assert torch.equal(episode_owners(lengths, episode, 2), owner)  # the same on every rank
    assert episode_owners(lengths[:0], episode[:0], 3).tolist() == []
    assert episode_owners(lengths, episode, 1).tolist() == [0] * 8
    assert episode_owners(torch.tensor([7, 7]), torch.tensor([0, 1]), 4).tolist() == [1, 3]  # fewer episodes than ranks


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(1, 8))
def test_each_rank_holds_an_equal_share_up_to_the_episodes_at_its_ends(tokens, world):
    owner = episode_owners(torch.tensor(tokens), torch.arange(len(tokens)), world)
    assert owner.tolist() == sorted(owner.tolist())  # consecutive runs
    share = sum(tokens) / world
    for r in range(world):
        held = sum(t for t, o in zip(tokens, owner.tolist()) if o == r)
        assert abs(held - share) <= 2 * max(tokens) / 2 + 1e-9 or held == 0 and share <= max(tokens)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 9)), min_size=1, max_size=30),
       st.integers(1, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_dealt_by_episode_every_row_once_whole_episodes_equal_counts(rows_spec, world, micro, rnd):
    """Every row trained once, every episode's rows on one rank, equal counts; a rank pads with a
    row of its own episodes (the token arrays it holds) whenever it has one."""
    traj = torch.tensor([t for t, _ in rows_spec])
    lengths = torch.tensor([n for _, n in rows_spec])
    owner = episode_owners(lengths, traj, world)
    for t in set(traj.tolist()):
        assert len(set(owner[traj == t].tolist())) == 1
    minis = list(torch.tensor(rnd.sample(range(len(traj)), len(traj))).split(max(1, len(traj) // 2)))
    trained: list[int] = []
    for mini in minis:
        per_rank = [shard_micro_batches(lengths, mini, rank=r, world_size=world, micro_rows=micro, owner=owner)
                    for r in range(world)]
        assert len({len(c) for c in per_rank}) == 1
        for r, chunks in enumerate(per_rank):
            for idx, real in chunks:
                if real:
                    assert (owner[idx] == r).all()
                    trained += idx.tolist()
                elif bool((owner == r).any()):
                    assert owner[idx].tolist() == [r]
    assert sorted(trained) == list(range(len(traj)))
    masks = [owned_rows(lengths, minis, rank=r, world_size=world, micro_rows=micro, owner=owner)
             for r in range(world)]
    for r, m in enumerate(masks):
        assert torch.equal(m, owner == r)
