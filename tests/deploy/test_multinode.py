"""Learner ranks that must span nodes: two Ray nodes on this machine (loopback), one CPU each, so
the PACK placement group puts one rank on each; the rendezvous moves from the one-node FileStore
to a TCPStore at rank 0's node. Checked with a gloo all-reduce between the two ranks, then one
DeepSpeed step of the real learner actors (`deploy.topology.start_learners`)."""

import pytest
import torch

from deploy.config_loading import load_config
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from learner.types import TrainRow

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=512)


class _Rank:
    """A bare learner rank: joins the process group the way LearnerWorker does and all-reduces."""

    def all_reduce(self, rendezvous: str, rank: int) -> dict:
        import os

        import ray
        import torch.distributed as dist

        from learner.backends import init_process_group_on_node

        init_process_group_on_node(rendezvous, rank=rank, world_size=2, backend="gloo", timeout_s=60)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        dist.destroy_process_group()
        return {"sum": float(value), "node": ray.get_runtime_context().get_node_id(),
                "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}


def _rows() -> list[TrainRow]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for t in range(4):
        response = tuple(torch.randint(3, 300, (4,), generator=gen).tolist())
        rows.append(TrainRow(prompt_ids=tuple(torch.randint(3, 300, (6,), generator=gen).tolist()),
                             response_ids=response, sampler_logprobs=(-1.0,) * len(response), group_id="g",
                             traj_id=f"t{t}", step_idx=0, episode_score=10.0 if t == 0 else 0.0,
                             action_valid=True))
    return rows


@pytest.mark.ray
@pytest.mark.deepspeed
@pytest.mark.slow
def test_learner_ranks_span_two_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import remove_placement_group

    from deploy.topology import place_learners, start_learners, stop_learners

    model = build_tiny_model(tmp_path / "model", ["go to desk 1", "look", "inventory"] * 20, TINY)
    cfg = load_config(None, ["ray.num_learners=2", "ray.learner_cpus=1", "learner.use_deepspeed=true",
                             "learner.kl_coef=0", "learner.micro_batch_rows=2", "learner.shuffle_rows=false"])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, namespace="test_multinode")
        place = place_learners(cfg)
        assert len(set(place.rank_nodes)) == 2  # one CPU per node: PACK had to spread
        assert place.rendezvous == f"tcp://127.0.0.1:{place.master_port}"
        ranks = [ray.remote(_Rank).options(num_cpus=1, scheduling_strategy=place.strategy(r)).remote()
                 for r in range(2)]
        out = ray.get([a.all_reduce.remote(place.rendezvous, r) for r, a in enumerate(ranks)], timeout=120)
        assert [o["sum"] for o in out] == [3.0, 3.0]
        assert [o["node"] for o in out] == place.rank_nodes
        assert {o["ifname"] for o in out} == {"lo"}  # the interface that reaches rank 0's node
        for a in ranks:
            ray.kill(a)
        remove_placement_group(place.placement_group)

        group = start_learners(cfg, str(model))
        assert group.rendezvous_file.startswith("tcp://")
        rows = _rows()
        before = [torch.tensor(s) for s in ray.get([a.score.remote(rows) for a in group.actors], timeout=300)]
        metrics = ray.get([a.train_step.remote(rows) for a in group.actors], timeout=300)
        after = [torch.tensor(s) for s in ray.get([a.score.remote(rows) for a in group.actors], timeout=300)]
        assert metrics[0].loss == pytest.approx(metrics[1].loss, abs=1e-6) and metrics[0].grad_norm > 0
        assert torch.allclose(before[0], before[1], atol=1e-6)
        assert torch.allclose(after[0], after[1], atol=1e-6)  # the ranks stay replicas
        assert (after[0] - before[0]).abs().max() > 1e-4  # and the step changed the policy
        stop_learners(group)
    finally:
        ray.shutdown()
        cluster.shutdown()
