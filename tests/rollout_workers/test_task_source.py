"""Dynamic episode assignment on the worker side (`rollout_workers.task_source`,
`RolloutWorker.collect_units`): workers take task groups from a shared source as their env slots
free up, every group is played exactly once, and a group's episodes do not depend on which worker
played it (each unit carries its seed). Real worker, real household envs, simulated engine."""

from __future__ import annotations

import threading

import pytest

from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import sample_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.task_source import ListSource, TaskUnit, in_task_order
from rollout_workers.worker import RolloutWorker

ENV = EnvConfig(max_steps=6)
ENGINE = EngineConfig(engine="simulated", simulated_time_scale=1e-4, simulated_response_tokens=20)
ROLLOUT = RolloutConfig(loop="async", assignment="dynamic", use_think=False, constrained_actions=True,
                        max_response_tokens=64, max_prompt_tokens=100_000, seed=3)


def _units(n: int) -> list[TaskUnit]:
    return [TaskUnit(i, t, derive_seed(11, i)) for i, t in enumerate(sample_tasks(ENV, "train", n, seed=0))]


def _worker(groups_at_once: int) -> RolloutWorker:
    return RolloutWorker(ENGINE, ROLLOUT, "", [EnvPool(ENV, 2 * groups_at_once)])


def _signature(trajectories) -> list:
    return [(t.group_id.split("#")[0], [(tuple(x.response_ids), x.env_action) for x in t.turns]) for t in trajectories]


def test_workers_share_a_source_and_results_do_not_depend_on_who_played():
    alone = ListSource(_units(6))
    played, stats = _worker(2).collect_units(alone, group_size=2, policy_version=0)
    assert sorted(played) == sorted(alone.finished) == list(range(6)) and stats.num_episodes == 12

    shared, workers = ListSource(_units(6)), [_worker(1), _worker(2)]
    out: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda i=i, w=w: out.__setitem__(i, w.collect_units(
        shared, group_size=2, policy_version=0)[0])) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted([*out[0], *out[1]]) == list(range(6))  # every group exactly once, across both workers
    both = in_task_order({**out[0], **out[1]})
    assert _signature(both) == _signature(in_task_order(played))
    assert [t.task for t in both][::2] == [u.task for u in _units(6)]


def test_dynamic_assignment_needs_the_async_loop():
    with pytest.raises(ValueError, match="rollout.loop=async"):
        RolloutConfig(assignment="dynamic")
    worker = RolloutWorker(ENGINE, RolloutConfig(use_think=False, constrained_actions=True), "", [EnvPool(ENV, 2)])
    with pytest.raises(ValueError, match="rollout.loop=async"):
        worker.collect_units(ListSource(_units(1)), group_size=2, policy_version=0)
