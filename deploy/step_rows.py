"""A step's training data by reference: the learner ranks fetch the step's trajectories from the
Ray object store themselves and build the rows there, so the driver never fetches a token array
nor builds, pickles or ships a training row (docs/architecture.md "Who holds which bytes").

Each collect call of the rollout workers leaves two objects (`RolloutWorker.collect_apart`): the
episodes' summaries (what the driver decides on) and their token pack (what only the learners
read). The driver decides on the summaries: which episodes are learnt from (`played`: the
infrastructure-failure split), the SMRC-SD teacher messages (written by its router, keyed by
(traj_id, turn)) and the discount.

A rank fetches, joins and builds the rows of its own episodes only (`StepRows.shard`): the episodes are
dealt to the ranks from the summaries' token counts (`learner.sharding.episode_owners`, the same on
every rank), and the other ranks' rows are blank rows of their lengths (`learner.batch.blank_row`),
which the learner's advantages, mini-batches and loss denominators read and its passes never forward.
It renders the teacher messages of its own episodes with its own tokenizer (the model's, as the
router's; `own_render`), and archives the episodes it keeps (`deploy.step_archive`). A UniSkill
step, whose passes read every row, has every rank join every episode (`StepRows.rows`, the teacher
messages rendered a share a rank and exchanged: `shared_render`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from deploy.step_archive import merge_parts, write_part
from learner.batch import blank_ids, rows_from_trajectories
from learner.collectives import all_gather_objects, distributed
from learner.sharding import episode_owners
from learner.types import TrainRow
from rollout_workers.prompts import ChatTokenizer, render_prompts
from rollout_workers.summaries import join
from rollout_workers.task_source import in_task_order
from rollout_workers.types import Trajectory, TrajectorySummary

K = TypeVar("K")
StoredResult = tuple[Any, Any]
"""The object refs of one collect call's result: (its summaries and stats, its token pack)."""


def unpack(values: Sequence[Any]) -> list[TrajectorySummary]:
    """The step's episodes in step order from its calls' first return values: a static collect's
    calls return (summaries, stats), in order; a dynamic collect's return ({unit index: group},
    stats), in any order (`deploy.dispatch`)."""
    if values and isinstance(values[0][0], dict):
        return in_task_order({i: g for groups, _ in values for i, g in groups.items()})
    return [t for trajectories, _ in values for t in trajectories]


def episodes_of(value: Any) -> list[TrajectorySummary]:
    """The episodes of one collect call's first return value (either form, `unpack`)."""
    episodes, _ = value
    return [t for g in episodes.values() for t in g] if isinstance(episodes, dict) else list(episodes)


def with_tokens(summaries: Sequence[TrajectorySummary], refs: Sequence[StoredResult]) -> list[Trajectory]:
    """The full trajectories of `summaries` (in their order): their token packs fetched from the
    object store and joined (`rollout_workers.summaries.join`)."""
    import ray

    return join(summaries, ray.get([pack for _, pack in refs])) if summaries else []


@dataclass(frozen=True)
class Shard:
    """A step as one learner rank holds it (`StepRows.shard`)."""

    rows: list[TrainRow]
    """Every row of the step: this rank's episodes' rows whole, the others' blank."""
    owners: list[int]
    """The rank that trains each row (`LearnerWorker.train_step(owners=...)`)."""
    order: list[str]
    """Every episode of the step (played or not), in step order: the archive's order."""
    keepers: dict[str, int]
    """traj_id -> the rank that holds the episode (trains its rows, archives it)."""
    held: dict[str, Trajectory]
    """This rank's episodes, whole: the played ones, and with an archive every one it keeps."""


@dataclass(frozen=True)
class StepRows:
    refs: tuple[StoredResult, ...]
    """Object refs of the step's collect results, in the step's trajectory order."""
    played: frozenset[str]
    """traj_ids to learn from (infrastructure failures are left out)."""
    teacher_messages: Mapping[tuple[str, int], str] = field(default_factory=dict)
    """(traj_id, turn) -> the teacher's user message (`deploy.stages.smrc_sd.RoutingResult`)."""
    gamma: float = 1.0
    archive: str | None = None
    """When set, every trajectory of the step is archived there as JSONL (`run.save_trajectories`):
    each rank writes the episodes it keeps and rank 0 merges them (`archive_part`, `merge_archive`),
    or rank 0 writes them all (`write_archive`)."""

    @classmethod
    def of(cls, refs: Sequence[StoredResult], played: Sequence[TrajectorySummary],
           teacher_messages: Mapping[tuple[str, int], str] | None, *, gamma: float,
           archive: str | Path | None = None) -> StepRows:
        return cls(tuple(refs), frozenset(t.traj_id for t in played), dict(teacher_messages or {}), gamma,
                   None if archive is None else str(archive))

    def trajectories(self) -> list[Trajectory]:
        """Every trajectory of the step (its summaries and token packs fetched from the object store)."""
        import ray

        return with_tokens(unpack(ray.get([summaries for summaries, _ in self.refs])), self.refs)

    def shard(self, tokenizer: ChatTokenizer | None = None, *, rank: int = 0, world_size: int = 1) -> Shard:
        """The step as rank `rank` holds it (`Shard`): every episode is kept by one rank, dealt pack
        by pack in consecutive runs of about equal trainable tokens (`learner.sharding.episode_owners`
        on the summaries' token counts; an episode with nothing to train weighs nothing, so it goes
        with its neighbours); the rank fetches only the packs that hold its episodes (about
        1/`world_size` of the step's packs, plus those its run shares with its neighbours') and joins
        its played episodes (all it keeps when the step is archived). Its rows are those episodes'
        rows built from their token arrays, every other row blank (`learner.batch.blank_row`): the
        same rows as `rows` where this rank owns them. The teacher messages of its own episodes are
        rendered here, the others' are blank prompts of their lengths (`own_render`): a collective
        when there are teacher messages and `world_size` > 1."""
        import ray

        values = ray.get([summaries for summaries, _ in self.refs])
        every = unpack(values)  # in step order, as the rows and the archive
        in_packs = [t for value in values for t in episodes_of(value)]
        weights = [sum(turn.num_prompt_tokens + turn.num_response_tokens for turn in t.turns if turn.num_response_tokens)
                   if t.traj_id in self.played else 0 for t in in_packs]
        dealt = episode_owners(torch.tensor(weights, dtype=torch.long), torch.arange(len(in_packs)), world_size)
        keepers = {t.traj_id: r for t, r in zip(in_packs, dealt.tolist())}
        played = [t for t in every if t.traj_id in self.played]
        owners = [keepers[t.traj_id] for t in played for turn in t.turns if turn.num_response_tokens]
        mine = {t for t, r in keepers.items() if r == rank and (t in self.played or self.archive is not None)}
        packs = [pack for (_, pack), value in zip(self.refs, values)
                 if any(t.traj_id in mine for t in episodes_of(value))]
        held = {t.traj_id: t for t in join([t for t in every if t.traj_id in mine], ray.get(packs))}
        if self.teacher_messages and tokenizer is None:
            raise ValueError("StepRows.shard: the step has teacher messages; pass the model's tokenizer to render them")
        prompts = own_render(tokenizer, self.teacher_messages, mine, world_size=world_size) \
            if self.teacher_messages else None
        rows = rows_from_trajectories([held.get(t.traj_id, t) for t in played], prompts, gamma=self.gamma)
        return Shard(rows, owners, [t.traj_id for t in every], keepers, held)

    def rows(self, trajectories: Sequence[Trajectory], tokenizer: ChatTokenizer | None = None, *, rank: int = 0,
             world_size: int = 1) -> list[TrainRow]:
        """The training rows of the played episodes (`learner.batch.rows_from_trajectories`), their
        teacher messages rendered to prompt ids with `tokenizer` (required when there are any):
        with several ranks each renders its share and they exchange the ids (`shared_render`).
        Every rank calls this together when `world_size` > 1 (a collective)."""
        played = [t for t in trajectories if t.traj_id in self.played]
        if self.teacher_messages and tokenizer is None:
            raise ValueError("StepRows.rows: the step has teacher messages; pass the model's tokenizer to render them")
        prompts = shared_render(tokenizer, self.teacher_messages, rank=rank, world_size=world_size) \
            if self.teacher_messages else None
        return rows_from_trajectories(played, prompts, gamma=self.gamma)

    def archive_part(self, shard: Shard, *, rank: int, world_size: int) -> None:
        """Before the update: the archive's lines of the episodes this rank keeps (`deploy.step_archive`)."""
        if self.archive is not None:
            kept = [shard.held[t] for t in shard.order if shard.keepers[t] == rank]
            write_part(self.archive, kept, rank=rank, world_size=world_size)

    def merge_archive(self, shard: Shard, *, world_size: int) -> None:
        """Rank 0, after the update: the archive from every rank's part (`deploy.step_archive`)."""
        if self.archive is not None:
            merge_parts(self.archive, shard.order, shard.keepers, world_size=world_size)

    def write_archive(self, trajectories: Sequence[Trajectory]) -> None:
        if self.archive is not None:
            path = Path(self.archive)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))


def render_share(messages: Mapping[K, str], *, rank: int, world_size: int) -> list[K]:
    """The keys rank `rank` renders: by message length (longest first, then key), every
    `world_size`-th from position `rank`, so the ranks' shares hold about equal text. The same
    on every rank."""
    order = sorted(messages, key=lambda k: (-len(messages[k]), repr(k)))
    return order[rank::world_size]


def shared_render(tokenizer: ChatTokenizer, messages: Mapping[K, str], *, rank: int,
                  world_size: int) -> dict[K, np.ndarray]:
    """`render_prompts` of every message, each rendered by one rank (`render_share`) and gathered on
    all (`learner.collectives.all_gather_objects`: int32 arrays, a few bytes a token). A tokenizer
    encodes about a million tokens a second on one core (docs/results.md "Driver at scale"), so a
    step's teacher prompts cost each rank 1/world_size of that instead of all of it."""
    if not distributed(world_size):
        rank, world_size = 0, 1  # no process group to exchange over: this rank renders them all
    mine = render_prompts(tokenizer, {k: messages[k] for k in render_share(messages, rank=rank, world_size=world_size)})
    share = {k: np.asarray(ids, dtype=np.int32) for k, ids in mine.items()}
    return {k: ids for part in all_gather_objects(share, world_size=world_size) for k, ids in part.items()}


def own_render(tokenizer: ChatTokenizer, messages: Mapping[tuple[str, int], str], owned: Collection[str], *,
               world_size: int) -> dict[tuple[str, int], np.ndarray]:
    """Teacher prompt ids by (traj_id, turn): the messages of this rank's episodes (`owned`
    traj_ids) rendered with `tokenizer` (`render_prompts`), every other rank's as blank ids of the
    length its owner rendered (`learner.batch.blank_ids`; the lengths are gathered over the process
    group, a few bytes a message): a rank scores the teacher prompts of its own rows only, and
    reads the others' lengths alone (the teacher pass's micro-batch counts). Messages of episodes
    that no rank owns (no turn to train) are left out. Without a process group the rank renders them all."""
    if not distributed(world_size):
        return {k: np.asarray(ids, dtype=np.int32) for k, ids in render_prompts(tokenizer, messages).items()}
    mine = render_prompts(tokenizer, {k: m for k, m in messages.items() if k[0] in owned})
    parts = all_gather_objects({k: len(ids) for k, ids in mine.items()}, world_size=world_size)
    lengths = {k: n for part in parts for k, n in part.items()}
    return {k: np.asarray(mine[k], dtype=np.int32) if k in mine else blank_ids(n) for k, n in lengths.items()}
