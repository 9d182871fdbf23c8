"""Data-parallel sharding of a step's rows into micro-batches (docs/algorithms.md S7.9).

Every rank receives the same rows; each trains (or scores) a share of them. One rule serves the
actor update and its no-grad pass, the proposer update and UniSkill's scoring pass: sort by
length, stride by rank, pad to equal count. Sorting by length keeps the padding inside a
micro-batch small; since every loss denominator is mini-batch-global, how the rows are split
never changes the loss. Equal counts keep ZeRO collectives lined up: a short rank runs
zero-weight repeats of one row (real=False) instead of idling.

Pure torch on index tensors: no config, no process group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from learner.types import Chunk


def shard_micro_batches(
    lengths: torch.Tensor,
    rows: torch.Tensor,
    *,
    rank: int,
    world_size: int,
    micro_rows: int,
    shared: torch.Tensor | None = None,
) -> list[Chunk]:
    """Rank `rank`'s micro-batches of `rows`: sort by length, stride by rank, pad to equal count.

    lengths (N,): token count of every row (indices below point into it); rows (n,) int64.
    The rows, stably sorted by length, are strided by rank: rank r owns sorted[r::world_size],
    so every row is owned by exactly one rank. `shared` rows (int64, same index space) join the
    share of EVERY rank (UniSkill's proposals in its scoring pass: every rank trains some of
    them). The share is stably sorted by length and split into micro-batches of `micro_rows`
    (real=True), then padded with (the shortest of all given rows, real=False) to
    ceil((len(shared) + ceil(n / world_size)) / micro_rows) micro-batches: the same count on
    every rank. A rank with an empty share gets padding only; no rows at all give [].
    """
    shared = rows.new_zeros(0) if shared is None else shared
    every = torch.cat([shared, rows])
    if len(every) == 0:
        return []
    by_length = rows[torch.argsort(lengths[rows], stable=True)]
    mine = torch.cat([shared, by_length[rank::world_size]])
    mine = mine[torch.argsort(lengths[mine], stable=True)]
    count = math.ceil((len(shared) + math.ceil(len(rows) / world_size)) / micro_rows)
    chunks = [(c, True) for c in mine.split(micro_rows)] if len(mine) else []
    padding = every[torch.argsort(lengths[every], stable=True)[:1]]
    return chunks + [(padding, False)] * (count - len(chunks))


def owned_rows(
    lengths: torch.Tensor, minis: Sequence[torch.Tensor], *, rank: int, world_size: int, micro_rows: int
) -> torch.Tensor:
    """(N,) bool: the rows `shard_micro_batches` gives rank `rank` over all mini-batches
    (deterministic: any rank can compute any other rank's share)."""
    owned = torch.zeros(len(lengths), dtype=torch.bool)
    for mini in minis:
        for idx, real in shard_micro_batches(
            lengths, mini, rank=rank, world_size=world_size, micro_rows=micro_rows
        ):
            owned[idx] = owned[idx] | real
    return owned
