"""The learner's side of collective weight sync under ZeRO-3 on two gloo ranks (learner/
weight_sender.py): both ranks run the module-by-module stream (each module gathered only while it
is copied into a bucket), rank 0 alone broadcasts, and the receiver gets exactly the model's
weights, cast to the wire dtype, while no parameter is left materialised on either rank."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from learner.config import LearnerConfig
from learner.worker import LearnerWorker
from weightsync.group import GroupSpec, WeightGroup
from weightsync.protocol import receive_weights

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def _rank_main(rank: int, model_dir: str, port: int, spec: GroupSpec, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    cfg = LearnerConfig(use_deepspeed=True, zero_stage=3, kl_coef=0.0, seed=0)
    w = LearnerWorker(cfg, model_dir, rank=rank, world_size=2, master_port=port)
    if rank == 0:
        w.join_weight_group(spec)
    sent = w.broadcast_weights("bfloat16", 0.01)
    left = max(p.numel() for p in w.backend.module.parameters())  # 0: every gather was released
    Path(out).joinpath(f"rank{rank}.json").write_text(json.dumps({"sent": sent, "left": left}))


def test_zero3_ranks_stream_module_by_module_and_rank0_broadcasts(tiny_model_dir, free_port, tmp_path):
    from transformers import AutoModelForCausalLM

    spec = GroupSpec(name="zero3", members=("learner_0", "receiver"), timeout_s=120,
                     store_file=str(tmp_path / "store"))
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, str(tiny_model_dir), port, spec, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    group = WeightGroup(spec, 1)
    got = {}
    buckets = 0
    for bucket in receive_weights(group):
        buckets += 1
        got.update({name: t.clone() for name, t in bucket})
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]

    want = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())
    assert list(got) == list(want) and buckets > 3
    for name, t in got.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, want[name].detach().to(torch.bfloat16)), name
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["sent"] == sum(t.nbytes for t in got.values()) and ranks[1]["sent"] == 0
    assert ranks[0]["left"] == ranks[1]["left"] == 0
