"""LoRA on the DeepSpeed learner (CPU, gloo): ZeRO-2 and ZeRO-3 over two data-parallel ranks give
one torch rank's update (loss, grad norm, adapter weights after each of two steps: the first moves
lora_B off zero, the second gives lora_A its first gradient), with the KL reference computed by the
same engine with its adapters disabled; and a ZeRO-3 LoRA checkpoint (adapter and optimizer states,
no frozen base) resumes bit-identically."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from learner.config import LearnerConfig
from learner.lora import adapter_stream
from learner.worker import LearnerWorker
from weightsync.adapter import read_adapter_dir

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def cfg(**kw) -> LearnerConfig:
    base = {"lr": 1e-2, "use_deepspeed": True, "kl_coef": 0.05, "micro_batch_rows": 2, "shuffle_rows": False,
            "seed": 3, "eps": 1.0, "entropy_coeff": 0.01, "lora": {"enabled": True, "rank": 4, "alpha": 8.0}}
    return LearnerConfig(**{**base, **kw})


def _rank_main(rank: int, model_dir: str, port: int, out_dir: str, rows_json: str) -> None:
    """One data-parallel rank: ZeRO-2, then ZeRO-3 (the same default group), two steps each."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from learner.types import TrainRow

    batches = [[TrainRow.model_validate(r) for r in rows] for rows in json.loads(rows_json)]
    for stage in STAGES:
        w = LearnerWorker(cfg(zero_stage=stage), model_dir, rank=rank, world_size=2, master_port=port)
        metrics = []
        for k, rows in enumerate(batches):
            metrics.append(w.train_step(rows).model_dump(mode="json"))
            w.export_adapter(str(Path(out_dir) / f"zero{stage}_adapter_{k + 1}"))
        if rank == 0:
            Path(out_dir, f"zero{stage}_metrics.json").write_text(json.dumps(metrics))
        del w


STAGES = (2, 3)


def test_zero2_and_zero3_on_two_ranks_match_one_torch_rank(tiny_model_dir, make_rows, free_port, tmp_path):
    batches = [make_rows(seed=1)[:11], make_rows(seed=2)[:11]]  # odd: uneven shards get padded micro-batches
    rows_json = json.dumps([[r.model_dump() for r in rows] for rows in batches])
    ctx, port, out = mp.get_context("spawn"), free_port(), tmp_path / "dp2"
    procs = [ctx.Process(target=_rank_main, args=(r, str(tiny_model_dir), port, str(out), rows_json)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=420)
    assert [p.exitcode for p in procs] == [0, 0]

    single = LearnerWorker(cfg(use_deepspeed=False), str(tiny_model_dir))
    want = []
    for rows in batches:
        want.append((single.train_step(rows), {k: v.clone() for k, v in adapter_stream(single.backend.module)[1]}))
    for stage in STAGES:
        dp = json.loads((out / f"zero{stage}_metrics.json").read_text())
        for k, (m, adapter) in enumerate(want):
            assert dp[k]["loss"] == pytest.approx(m.loss, abs=1e-6), stage
            assert dp[k]["kl"] == pytest.approx(m.kl, abs=1e-6), stage
            assert dp[k]["grad_norm"] == pytest.approx(m.grad_norm, rel=1e-4), stage
            got, _ = read_adapter_dir(out / f"zero{stage}_adapter_{k + 1}")
            assert set(got) == set(adapter)
            for name, t in adapter.items():
                torch.testing.assert_close(got[name], t, atol=1e-6, rtol=0, msg=f"ZeRO-{stage} {name}")
        assert dp[1]["kl"] > 0  # the reference (adapters off) differs from the trained policy


def test_zero3_lora_checkpoint_resumes_bit_identically(tiny_model_dir, make_rows, free_port, tmp_path):
    rows1, rows2 = make_rows(seed=1), make_rows(seed=2)
    w = LearnerWorker(cfg(zero_stage=3, micro_batch_rows=4), str(tiny_model_dir), master_port=free_port())
    w.train_step(rows1)
    w.save_checkpoint(str(tmp_path / "ckpt"))
    m2 = w.train_step(rows2)
    w.export_adapter(str(tmp_path / "want"))
    [states] = (tmp_path / "ckpt").rglob("*model_states.pt")
    module = torch.load(states, map_location="cpu", weights_only=False)["module"] or {}
    assert module and all(".lora_A." in k or ".lora_B." in k for k in module)  # no base weight, tied head included

    again = LearnerWorker(cfg(zero_stage=3, micro_batch_rows=4), str(tiny_model_dir), master_port=free_port())
    assert again.load_checkpoint(str(tmp_path / "ckpt")) == 1
    m2_again = again.train_step(rows2)
    again.export_adapter(str(tmp_path / "got"))
    assert (m2_again.loss, m2_again.grad_norm, m2_again.kl) == (m2.loss, m2.grad_norm, m2.kl)
    got, want = read_adapter_dir(tmp_path / "got")[0], read_adapter_dir(tmp_path / "want")[0]
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
