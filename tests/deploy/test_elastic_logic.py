"""Elastic rollout workers, pure parts (`deploy.elastic`): the config keys, how many units fit a
node, the scale plan, and where a lost worker's calls are re-run."""

import pytest

from deploy.config_loading import ConfigError, load_config
from deploy.elastic import (
    NodeView,
    WorkerView,
    is_lost,
    plan_scale,
    reassign_lost,
    unit_demand,
    units_that_fit,
)

SMOKE = "deploy/configs/smoke_cpu.yaml"
UNIT = {"CPU": 1.25}


def test_auto_needs_max_workers_and_max_workers_needs_auto():
    cfg = load_config(SMOKE, ["rollout.num_workers=auto", "rollout.max_workers=3"])
    assert (cfg.rollout.num_workers, cfg.rollout.max_workers, cfg.rollout.initial_workers) == ("auto", 3, 1)
    assert load_config(SMOKE, ["rollout.num_workers=2", "ray.env_pools=2"]).rollout.initial_workers == 2
    with pytest.raises(ConfigError, match="rollout.max_workers, which is not set; set rollout.max_workers"):
        load_config(SMOKE, ["rollout.num_workers=auto"])
    with pytest.raises(ConfigError, match="rollout.max_workers=2 bounds rollout.num_workers=auto only"):
        load_config(SMOKE, ["rollout.max_workers=2"])
    with pytest.raises(ConfigError, match="max_workers"):
        load_config(SMOKE, ["rollout.num_workers=auto", "rollout.max_workers=0"])
    with pytest.raises(ConfigError, match="num_workers"):
        load_config(SMOKE, ["rollout.num_workers=many"])
    with pytest.raises(ConfigError, match="rollout.num_workers=auto places one worker .* tensor-parallel"):
        load_config(SMOKE, ["rollout.num_workers=auto", "rollout.max_workers=2", "engine.tensor_parallel_size=2",
                            "ray.rollout_gpus=2"])


def test_auto_gives_each_worker_its_own_pools():
    # one pool per worker with auto, so env_pools=1 < max_workers=2 is fine; the group check uses
    # the pools of one worker
    cfg = load_config(SMOKE, ["rollout.num_workers=auto", "rollout.max_workers=2", "ray.env_pools=1"])
    assert unit_demand(cfg) == {"CPU": cfg.ray.rollout_cpus + cfg.ray.env_pool_cpus}
    with pytest.raises(ConfigError, match="each rollout worker hosts 4 environments"):
        load_config(SMOKE, ["rollout.num_workers=auto", "rollout.max_workers=2", "ray.envs_per_pool=4",
                            "rollout.group_size=6"])


def test_units_that_fit():
    assert units_that_fit({"CPU": 2.5}, UNIT) == 2
    assert units_that_fit({"CPU": 1.2}, UNIT) == 0
    assert units_that_fit({"CPU": 3.75}, UNIT) == 3  # exact multiples fit despite float error
    assert units_that_fit({"CPU": 8.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}) == 1  # the scarcer resource bounds
    assert units_that_fit({"CPU": 8.0}, {"CPU": 1.0, "GPU": 1.0}) == 0  # a node without GPUs holds none


def test_a_joining_node_gets_workers_up_to_max():
    head, new = NodeView("head", True, {"CPU": 0.75}), NodeView("new", True, {"CPU": 2.6})
    workers = [WorkerView("rollout_worker_0", "head")]
    assert plan_scale([head, new], workers, UNIT, max_workers=2).add == ("new",)
    assert plan_scale([head, new], workers, UNIT, max_workers=5).add == ("new", "new")
    assert plan_scale([head, new], workers, UNIT, max_workers=1).add == ()
    assert not plan_scale([head], workers, UNIT, max_workers=4).changed  # no room anywhere: nothing to do


def test_workers_of_a_dead_or_draining_node_leave_and_their_room_is_not_reused():
    nodes = [NodeView("head", True, {"CPU": 0.0}), NodeView("gone", False, {"CPU": 5.0}),
             NodeView("drain", True, {"CPU": 5.0}, draining=True), NodeView("spare", True, {"CPU": 1.3})]
    workers = [WorkerView("w0", "head"), WorkerView("w1", "gone"), WorkerView("w2", "drain"), WorkerView("w3", None)]
    plan = plan_scale(nodes, workers, UNIT, max_workers=4)
    assert plan.remove == ("w1", "w2")  # w3's node is unknown: kept
    assert plan.add == ("spare",)  # 4 - 2 kept = 2 wanted, but only "spare" has room, for one


def test_a_dead_worker_leaves_even_when_ray_no_longer_says_where_it_ran():
    assert is_lost("DEAD", None, {"head"})  # Ray clears a dead actor's address
    assert is_lost("RESTARTING", "gone", {"head"}) and not is_lost("RESTARTING", "head", {"head"})
    assert not is_lost("ALIVE", "gone", {"head"}) and not is_lost("PENDING_CREATION", None, {"head"})
    nodes = [NodeView("head", True, {"CPU": 0.0})]
    plan = plan_scale(nodes, [WorkerView("w0", "head"), WorkerView("w1", None, gone=True)], UNIT, max_workers=2)
    assert plan.remove == ("w1",) and plan.add == ()


def test_plan_refuses_a_bound_below_one():
    with pytest.raises(ValueError, match="max_workers=0"):
        plan_scale([], [], UNIT, max_workers=0)


def test_lost_calls_go_round_robin_to_the_survivors():
    assert reassign_lost([0, None, 1, None, None], 2) == [0, 0, 1, 1, 0]
    assert reassign_lost([None, None], 1) == [0, 0]
    assert reassign_lost([2, 0], 3) == [2, 0]  # calls of live workers stay where they are
    with pytest.raises(RuntimeError, match="no rollout worker is left"):
        reassign_lost([None], 0)


def _tcp_receiver(spec, queue) -> None:
    from weightsync.group import WeightGroup
    from weightsync.protocol import receive_weights

    got = {}
    for bucket in receive_weights(WeightGroup(spec, 1)):
        got.update({n: t.clone() for n, t in bucket})
    queue.put({n: t.tolist() for n, t in got.items()})


def test_weight_group_across_nodes_forms_with_rank_0_hosting_the_store():
    """Workers on a node other than learner rank 0's (an elastic worker on a joined node) make the
    weight-sync group use a TCPStore at rank 0's address: rank 0 must serve it, or every member
    waits for sync.timeout_s."""
    import multiprocessing as mp
    import socket
    import time

    import torch

    from weightsync.group import GroupSpec, WeightGroup
    from weightsync.protocol import metas_of, send_weights

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = GroupSpec(name=f"tcp{time.monotonic_ns()}", members=("learner_0", "rollout_worker_0"), timeout_s=30.0,
                     store_file=None, host="127.0.0.1", port=port)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_tcp_receiver, args=(spec, queue))
    proc.start()
    try:
        tensors = [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(3))]
        stats = send_weights(WeightGroup(spec, 0), metas_of(tensors), iter(tensors), bucket_bytes=4096)
        got = queue.get(timeout=60)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert stats.tensors == 2 and got == {n: t.tolist() for n, t in tensors}
