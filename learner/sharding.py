"""Data-parallel sharding of a step's rows into micro-batches (docs/algorithms.md S7.9).

Every rank receives the same rows (dealt by episode, below: the other ranks' token arrays blank);
each trains (or scores) a share of them. One rule serves the actor update and its no-grad pass, the
proposer update and UniSkill's scoring pass: sort by length, stride by rank, split into
micro-batches, pad to equal count. Sorting by length keeps the
padding inside a micro-batch small; since every loss denominator is mini-batch-global, how the
rows are split never changes the loss. Equal counts keep ZeRO collectives (and DeepSpeed's
gradient-accumulation boundaries) lined up: a short rank runs zero-weight repeats of one row
(real=False) instead of idling.

Two ways to split a rank's share: a fixed number of rows (`micro_rows`), or a token budget
(`max_tokens`): the length-sorted rows are packed greedily while (rows x longest row's tokens)
stays within the budget, so a long row never multiplies by a fixed row count (a row over the
budget runs alone). With a budget the shares of ALL ranks are packed (deterministically, on every
rank) and the largest count is everyone's count.

`split_micro_batches` applies the same split to rows whose owner is already decided (the SMRC-SD
teacher pass scores, under its own lengths, the rows the actor pass gave each rank).

Ownership by episode (`episode_owners`): when each rank should hold the token arrays of its own
episodes only (`deploy.step_rows.StepRows.shard`), every row of an episode goes to one rank, the
episodes cut into consecutive runs of about equal tokens. The shares of a mini-batch are then that
mini-batch's rows of each rank's episodes; the rest of the rule is the same.

Pure torch on index tensors: no config, no process group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from learner.types import Chunk


def pack_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[int]:
    """Sizes of consecutive groups of `lengths` (ascending) such that len(group) x max(group) <=
    max_tokens; a single length over the budget forms its own group."""
    sizes: list[int] = []
    count = 0
    for length in lengths:
        if count and (count + 1) * length > max_tokens:
            sizes.append(count)
            count = 0
        count += 1
    return sizes + [count] if count else sizes


def episode_owners(lengths: torch.Tensor, episode: torch.Tensor, world_size: int) -> torch.Tensor:
    """(N,) int64: the rank that owns each row, all rows of an episode on one rank. `episode` (N,)
    numbers each row's episode in dealing order (0, 1, ...); the episodes are cut into
    `world_size` consecutive runs of about equal tokens (the sum of their rows' `lengths`): an
    episode goes to the rank whose 1/world_size of the step's tokens holds its midpoint, so a
    rank's tokens differ from an equal share by at most the episodes at its two ends. Consecutive
    runs keep a rank's episodes in few collect calls' token packs when the numbering follows the
    packs (`deploy.step_rows.StepRows.shard`). Deterministic: every rank computes the same owners."""
    if len(episode) == 0:
        return episode.new_zeros(0)
    tokens = torch.zeros(int(episode.max()) + 1, dtype=torch.float64).index_add_(0, episode, lengths.double())
    middle = tokens.cumsum(0) - tokens / 2
    owner = (middle * world_size / tokens.sum().clamp_min(1.0)).floor().long().clamp(0, world_size - 1)
    return owner[episode]


def _share(lengths: torch.Tensor, rows: torch.Tensor, shared: torch.Tensor, rank: int, world_size: int,
           owner: torch.Tensor | None = None):
    if owner is None:
        by_length = rows[torch.argsort(lengths[rows], stable=True)]
        mine = torch.cat([shared, by_length[rank::world_size]])
    else:
        mine = torch.cat([shared, rows[owner[rows] == rank]])
    return mine[torch.argsort(lengths[mine], stable=True)]


def _split(lengths: torch.Tensor, mine: torch.Tensor, micro_rows: int, max_tokens: int | None) -> list[torch.Tensor]:
    if not len(mine):
        return []
    if max_tokens is None:
        return list(mine.split(micro_rows))
    return list(mine.split(pack_by_tokens(lengths[mine].tolist(), max_tokens)))


def split_micro_batches(
    lengths: torch.Tensor, rows: torch.Tensor, *, micro_rows: int, max_tokens: int | None = None
) -> list[torch.Tensor]:
    """`rows` (already assigned to this rank), stably sorted by length and split into groups of
    `micro_rows` rows, or packed by `max_tokens` when given (`pack_by_tokens`). No padding: a pass
    whose ownership is decided elsewhere (the teacher pass) pads to equal counts itself."""
    return _split(lengths, rows[torch.argsort(lengths[rows], stable=True)], micro_rows, max_tokens)


def shard_micro_batches(
    lengths: torch.Tensor,
    rows: torch.Tensor,
    *,
    rank: int,
    world_size: int,
    micro_rows: int,
    shared: torch.Tensor | None = None,
    max_tokens: int | None = None,
    owner: torch.Tensor | None = None,
) -> list[Chunk]:
    """Rank `rank`'s micro-batches of `rows`: sort by length, stride by rank, pad to equal count.

    lengths (N,): token count of every row (indices below point into it); rows (n,) int64.
    The rows, stably sorted by length, are strided by rank: rank r owns sorted[r::world_size],
    so every row is owned by exactly one rank. `shared` rows (int64, same index space) join the
    share of EVERY rank (UniSkill's proposals in its scoring pass: every rank trains some of
    them). The share is stably sorted by length and split into micro-batches (real=True) of
    `micro_rows` rows, or packed by `max_tokens` when given (`pack_by_tokens`); then padded with
    (the shortest of all given rows, real=False) to the same count on every rank:
    ceil((len(shared) + ceil(n / world_size)) / micro_rows) with fixed rows, the largest packed
    count of any rank with a token budget. A rank with an empty share gets padding only; no rows
    at all give [].

    `owner` (N,) (`episode_owners`): rank r's share is the rows of `rows` whose owner is r instead
    of a stride; the count is the largest of any rank's, and a padding micro-batch repeats the
    shortest row this rank owns in the whole batch (its token arrays are the ones this rank
    holds), the shortest given row when it owns none.
    """
    shared = rows.new_zeros(0) if shared is None else shared
    every = torch.cat([shared, rows])
    if len(every) == 0:
        return []
    mine = _share(lengths, rows, shared, rank, world_size, owner)
    chunks = [(c, True) for c in _split(lengths, mine, micro_rows, max_tokens)]
    if max_tokens is None and owner is None:
        count = math.ceil((len(shared) + math.ceil(len(rows) / world_size)) / micro_rows)
    else:
        count = max(
            len(_split(lengths, _share(lengths, rows, shared, r, world_size, owner), micro_rows, max_tokens))
            for r in range(world_size)
        )
    held = every if owner is None or not bool((owner == rank).any()) else torch.nonzero(owner == rank).squeeze(-1)
    padding = held[torch.argsort(lengths[held], stable=True)[:1]]
    return chunks + [(padding, False)] * (count - len(chunks))


def owned_rows(
    lengths: torch.Tensor,
    minis: Sequence[torch.Tensor],
    *,
    rank: int,
    world_size: int,
    micro_rows: int,
    max_tokens: int | None = None,
    owner: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) bool: the rows `shard_micro_batches` gives rank `rank` over all mini-batches
    (deterministic: any rank can compute any other rank's share). With `owner`: the mini-batches'
    rows that rank owns, read off without splitting."""
    owned = torch.zeros(len(lengths), dtype=torch.bool)
    for mini in minis:
        if owner is not None:
            owned[mini[owner[mini] == rank]] = True
            continue
        for idx, real in shard_micro_batches(
            lengths, mini, rank=rank, world_size=world_size, micro_rows=micro_rows, max_tokens=max_tokens
        ):
            owned[idx] = owned[idx] | real
    return owned
