"""A step's trajectory archive (`run.save_trajectories`: trajectories/step_N.jsonl, every episode of
the step in step order, one whole `Trajectory` a line) written by the learner ranks that hold the
episodes: each rank writes the lines of the episodes it keeps (`deploy.step_rows.Shard.keepers`) to
a part of its own, in step order, before the step's update; after it, rank 0 interleaves the parts'
lines into the archive in step order, as bytes (no JSON is parsed), and removes them. The update's
collectives order the two: rank 0 finishes the update only once every rank has entered it, so every
part is written. With one rank the archive is written at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from rollout_workers.types import Trajectory


def part_path(archive: str | Path, rank: int) -> Path:
    """Rank `rank`'s part of `archive` (named so that no `step_*.jsonl` reader picks it up)."""
    archive = Path(archive)
    return archive.with_name(f"{archive.name}.rank{rank}")


def write_part(archive: str | Path, trajectories: Sequence[Trajectory], *, rank: int, world_size: int) -> Path:
    """The lines of `trajectories` (this rank's kept episodes, in step order): the archive itself with
    one rank, else this rank's part."""
    path = Path(archive) if world_size == 1 else part_path(archive, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return path


def merge_parts(archive: str | Path, order: Sequence[str], keepers: Mapping[str, int], *, world_size: int) -> Path:
    """Rank 0, after the update: the archive from every rank's part, a line per traj_id of `order`
    taken from its keeper's part; the parts are removed. Raises ValueError naming a part that holds
    fewer or more lines than the episodes its rank keeps."""
    archive = Path(archive)
    if world_size == 1:
        return archive
    parts = [part_path(archive, r).read_bytes().splitlines(keepends=True) for r in range(world_size)]
    for r, lines in enumerate(parts):
        kept = sum(1 for t in order if keepers[t] == r)
        if len(lines) != kept:
            raise ValueError(f"{part_path(archive, r)}: {len(lines)} lines for the {kept} episodes rank {r} keeps")
    taken = [iter(lines) for lines in parts]
    tmp = archive.with_name(archive.name + ".tmp")
    tmp.write_bytes(b"".join(next(taken[keepers[t]]) for t in order))
    os.replace(tmp, archive)
    for r in range(world_size):
        part_path(archive, r).unlink()
    return archive
