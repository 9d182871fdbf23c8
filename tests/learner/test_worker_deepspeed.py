"""The DeepSpeed learner on CPU (gloo): ZeRO 0/2/3, fp32 and bf16; export to an HF directory
that transformers reloads with identical logits; checkpoint round trip; two data-parallel ranks
give the same update as one. The first DeepSpeed initialize JIT-compiles shm_comm (~25 s,
cached in ~/.cache/torch_extensions)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from learner.batch import collate_rows
from learner.config import LearnerConfig
from learner.logprobs import response_logits
from learner.worker import LearnerWorker

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


SD = {"sd": {"coef": 0.5}}


def ds_cfg(**kw) -> LearnerConfig:
    base = {"lr": 1e-3, "use_deepspeed": True, "kl_coef": 0.01, "micro_batch_rows": 4, "shuffle_rows": False}
    return LearnerConfig(**{**base, "seed": 3, **kw})


def full_state(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    state = worker.backend.export_state_dict()
    assert state is not None
    return {k: v.detach().float().clone() for k, v in state.items()}


@pytest.mark.parametrize(
    "stage, dtype, lr", [(0, "float32", 1e-3), (2, "bfloat16", 1e-2), (3, "float32", 1e-3)]
)
def test_update_trains_every_parameter_and_export_reloads(
    tiny_model_dir, make_rows, surrogate_loss, free_port, tmp_path, stage, dtype, lr
):
    from transformers import AutoModelForCausalLM

    rows = make_rows()
    cfg = ds_cfg(zero_stage=stage, dtype=dtype, lr=lr, kl_coef=0.0)
    w = LearnerWorker(cfg, str(tiny_model_dir), master_port=free_port())
    before, old = full_state(w), w.score(rows)
    m = w.train_step(rows)
    after, new = full_state(w), w.score(rows)
    assert [k for k in before if torch.equal(before[k], after[k])] == []
    assert surrogate_loss(w, rows, old, new) < surrogate_loss(w, rows, old, old)
    assert m.grad_norm > 0 and m.num_optimizer_steps == 1 and torch.isfinite(torch.tensor(m.loss))

    out = w.export_weights(str(tmp_path / "export"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch_dtype).eval()
    batch = collate_rows(rows, pad_token_id=0)
    with torch.no_grad():
        ours = response_logits(w.backend.forward_module(), batch, temperature=1.0)
        theirs = response_logits(reloaded, batch, temperature=1.0)
    torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=0)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_zero_stages_match_plain_torch(tiny_model_dir, make_rows, free_port, stage):
    """Same rows, several micro-batches per optimiser step: DeepSpeed's boundary handling and
    gradient clipping give the plain-torch update (eps=1 keeps AdamW linear, see test_worker_torch)."""
    rows = make_rows()
    cfg = ds_cfg(zero_stage=stage, eps=1.0, grad_clip=0.5)
    w = LearnerWorker(cfg, str(tiny_model_dir), master_port=free_port())
    m = w.train_step(rows)
    ref = LearnerWorker(
        LearnerConfig(**{**cfg.model_dump(), "use_deepspeed": False, "zero_stage": 0}), str(tiny_model_dir)
    )
    m_ref = ref.train_step(rows)
    got = full_state(w)
    for k, v in ref.backend.module.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0, msg=k)
    assert m.loss == pytest.approx(m_ref.loss, abs=1e-6)
    assert m.grad_norm == pytest.approx(m_ref.grad_norm, rel=1e-4)


@pytest.mark.parametrize("fp16_cpu", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero3_builds_weights_in_the_configured_dtype(tiny_model_dir, free_port, monkeypatch, dtype, fp16_cpu):
    """zero.Init must build the configured precision whatever the CPU: DeepSpeed's own dtype
    argument is ignored on CPUs without oneDNN fp16 (they got bf16 weights in an fp32 run)."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: fp16_cpu)
    w = LearnerWorker(ds_cfg(zero_stage=3, dtype=dtype), str(tiny_model_dir), master_port=free_port())
    want = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    assert {p.ds_tensor.dtype for p in w.backend.module.parameters()} == {want}
    assert {v.dtype for v in w.backend.export_state_dict().values()} == {want}


def test_checkpoint_round_trip(tiny_model_dir, make_rows, free_port, tmp_path):
    rows = make_rows()
    w = LearnerWorker(ds_cfg(zero_stage=2), str(tiny_model_dir), master_port=free_port())
    w.train_step(rows)
    w.save_checkpoint(str(tmp_path / "ckpt"))
    saved = full_state(w)
    w.train_step(rows)
    continued = full_state(w)
    assert w.load_checkpoint(str(tmp_path / "ckpt")) == 1
    for k, v in full_state(w).items():
        torch.testing.assert_close(v, saved[k], atol=0, rtol=0, msg=k)
    w.train_step(rows)  # restored Adam moments -> the same second update
    for k, v in full_state(w).items():
        torch.testing.assert_close(v, continued[k], atol=1e-7, rtol=0, msg=k)
    assert w.get_version() == 2


def _blank_others(rows: list, rank: int) -> tuple[list, list[int]]:
    """What `deploy.step_rows.StepRows.shard` hands rank `rank`: its episodes' rows, the others blank
    (their teacher prompts too, of the same length: `deploy.step_rows.own_render`)."""
    from types import SimpleNamespace

    from learner.batch import blank_ids, blank_row, collate_rows
    from learner.sharding import episode_owners

    batch = collate_rows(rows, pad_token_id=0)
    owners = episode_owners(batch.attention_mask.sum(-1), batch.traj_index, 2).tolist()
    out = []
    for row, owner in zip(rows, owners, strict=True):
        counts = SimpleNamespace(num_prompt_tokens=len(row.prompt_ids), num_response_tokens=len(row.response_ids))
        fields = row.model_dump(exclude={"prompt_ids", "response_ids", "sampler_logprobs", "allowed_token_ids"})
        if row.teacher_prompt_ids is not None:
            fields["teacher_prompt_ids"] = blank_ids(len(row.teacher_prompt_ids))
        out.append(row if owner == rank else blank_row(counts, **fields))
    return out, owners


def _rank_main(rank: int, model_dir: str, port: int, out_dir: str, rows_json: str, by_episode: bool,
               sd: bool) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from learner.types import TrainRow

    rows = [TrainRow.model_validate(r) for r in json.loads(rows_json)]
    owners = None
    if by_episode:
        rows, owners = _blank_others(rows, rank)
    w = LearnerWorker(
        ds_cfg(zero_stage=1, eps=1.0, micro_batch_rows=2, **SD if sd else {}),
        model_dir,
        rank=rank,
        world_size=2,
        master_port=port,
    )
    metrics = w.train_step(rows, owners=owners)
    w.export_weights(out_dir)
    if rank == 0:
        Path(out_dir, "metrics.json").write_text(metrics.model_dump_json())


@pytest.mark.parametrize("by_episode, sd", [(False, False), (True, False), (True, True)],
                         ids=["stride", "by_episode", "by_episode_smrc_sd"])
def test_two_ranks_match_one_rank(tiny_model_dir, make_rows, free_port, tmp_path, by_episode, sd):  # S7.9 over DP ranks
    """by_episode: each rank holds only its own episodes' token arrays, the other rows blank, and
    trains the rows it owns (`owners`): the same update as one rank holding everything. With
    SMRC-SD every other row has a teacher prompt (blank too on the other ranks), so the teacher
    pass and the "sd" loss run on the rows each rank owns."""
    from safetensors.torch import load_file

    rows = make_rows()[:11]  # odd: ranks get 6 and 5 rows -> uneven micro-batch counts get padded
    if sd:  # a teacher prompt: the row's own prompt with two extra ids in front
        rows = [r.model_copy(update={"teacher_prompt_ids": (5, 6, *r.prompt_ids)}) if i % 2 else r
                for i, r in enumerate(rows)]
    rows_json = json.dumps([r.model_dump() for r in rows])
    ctx = mp.get_context("spawn")
    out = tmp_path / "dp2"
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, str(tiny_model_dir), port, str(out), rows_json, by_episode, sd))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0]

    # eps=1 keeps AdamW linear in the gradient (see test_worker_torch), so float noise stays small
    single = LearnerWorker(
        LearnerConfig(**{**ds_cfg(eps=1.0, **SD if sd else {}).model_dump(), "use_deepspeed": False}),
        str(tiny_model_dir),
    )
    m_single = single.train_step(rows)
    got = load_file(str(out / "model.safetensors"))
    for k, v in single.backend.module.state_dict().items():
        if k in got:
            torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    m_dp = json.loads((out / "metrics.json").read_text())
    assert m_dp["loss"] == pytest.approx(m_single.loss, abs=1e-6)
    assert m_dp["kl"] == pytest.approx(m_single.kl, abs=1e-6)
    assert m_dp["sampler_logp_abs_diff"] == pytest.approx(m_single.sampler_logp_abs_diff, abs=1e-5)
    if sd:
        assert m_dp["extra_losses"]["sd"] == pytest.approx(m_single.extra_losses["sd"], abs=1e-6)
        assert m_single.extra_losses["sd"] != 0.0 and m_dp["extra_metrics"]["sd_match_rate"] == pytest.approx(5 / 11)
