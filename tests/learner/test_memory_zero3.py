"""The scale path under ZeRO-3 on two gloo ranks (learner/backends.py, learner/checkpoint.py):
the policy and the reference (ref_placement=shard) are built partitioned under zero.Init, so no
rank holds a full parameter; a step with gradient checkpointing, chunked log-probs and token-
budget micro-batches gives the single-rank plain-torch update; the export, written module by
module by rank 0 in several safetensors shards, reloads in transformers with those weights."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from learner.config import LearnerConfig
from learner.worker import LearnerWorker

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

BASE = {
    "lr": 1e-3, "eps": 1.0, "kl_coef": 0.01, "seed": 3, "shuffle_rows": False, "micro_batch_rows": 2,
    "max_tokens_per_micro_batch": 40, "gradient_checkpointing": True, "logprob_chunk_size": 3,
}  # fmt: skip


def _held_fraction(module: torch.nn.Module) -> float:
    """Largest share of any parameter's elements this rank holds (ZeRO-3 partition / full size)."""
    worst = 0.0
    for p in module.parameters():
        assert p.numel() == 0, "a parameter is materialised outside a forward"
        worst = max(worst, p.ds_tensor.numel() / p.ds_numel)
    return worst


def _rank_main(rank: int, model_dir: str, port: int, out_dir: str, rows_json: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from learner.checkpoint import export_hf_dir
    from learner.collectives import barrier
    from learner.types import TrainRow

    rows = [TrainRow.model_validate(r) for r in json.loads(rows_json)]
    cfg = LearnerConfig(**BASE, use_deepspeed=True, zero_stage=3, ref_placement="shard")
    w = LearnerWorker(cfg, model_dir, rank=rank, world_size=2, master_port=port)
    held = {"policy": _held_fraction(w.backend.module), "reference": _held_fraction(w.ref_model.module)}
    metrics = w.train_step(rows)
    export_hf_dir(w.backend, w.tokenizer, out_dir, rank=rank, max_shard_bytes=60_000)
    barrier(2)
    Path(out_dir).parent.joinpath(f"rank{rank}.json").write_text(
        json.dumps({"held": held, "metrics": json.loads(metrics.model_dump_json())})
    )


def test_zero3_two_ranks_partitioned_and_equal_to_one_rank(tiny_model_dir, make_rows, free_port, tmp_path):
    from transformers import AutoModelForCausalLM

    rows = make_rows()[:11]
    rows_json = json.dumps([r.model_dump() for r in rows])
    out, port = tmp_path / "export", free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, str(tiny_model_dir), port, str(out), rows_json)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:  # each rank holds about half of every parameter, never all of it
        assert r["held"]["policy"] <= 0.5 + 1e-9 and r["held"]["reference"] <= 0.5 + 1e-9
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").exists()

    single = LearnerWorker(LearnerConfig(**BASE, use_deepspeed=False), str(tiny_model_dir))
    m_single = single.train_step(rows)
    m_dp = ranks[0]["metrics"]
    assert m_dp["loss"] == pytest.approx(m_single.loss, abs=1e-5)
    assert m_dp["kl"] == pytest.approx(m_single.kl, abs=1e-6)
    assert m_dp["grad_norm"] == pytest.approx(m_single.grad_norm, rel=1e-4)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got = dict(reloaded.named_parameters())
    for k, v in single.backend.module.named_parameters():
        torch.testing.assert_close(got[k], v.detach(), atol=1e-6, rtol=0, msg=k)
    assert math.isfinite(m_dp["entropy"])
