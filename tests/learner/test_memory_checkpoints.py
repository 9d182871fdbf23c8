"""Checkpoint IO at scale (learner/checkpoint.py): the HF export is written module by module in
size-capped safetensors shards that transformers reloads with the learner's weights, and
`prune_checkpoints` (run.keep_checkpoints) keeps the newest complete checkpoints only."""

from __future__ import annotations

import json

import pytest
import torch

from learner.checkpoint import export_hf_dir, prune_checkpoints
from learner.config import LearnerConfig
from learner.worker import LearnerWorker


def test_sharded_export_reloads_with_the_learner_weights(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    w = LearnerWorker(LearnerConfig(use_deepspeed=False, kl_coef=0.0), str(tiny_model_dir))
    with torch.no_grad():
        for p in w.backend.module.parameters():
            p.add_(0.01)  # differ from the file the worker loaded
    out = export_hf_dir(w.backend, w.tokenizer, str(tmp_path / "hf"), rank=0, max_shard_bytes=50_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and files == {p.name for p in out.glob("*.safetensors")}
    assert not list(tmp_path.glob("*.tmp-export"))
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ours = dict(w.backend.module.named_parameters())
    for name, value in reloaded.named_parameters():
        torch.testing.assert_close(value, ours[name].detach(), atol=0, rtol=0, msg=name)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight  # tied, stored once
    single = export_hf_dir(w.backend, w.tokenizer, str(tmp_path / "one"), rank=0)
    assert [p.name for p in single.glob("*.safetensors")] == ["model.safetensors"]


def _ckpt(root, step, complete=True):
    d = root / f"step_{step:06d}"
    (d / "learner").mkdir(parents=True)
    if complete:
        (d / "trainer_state.json").write_text("{}")
    return d


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    old_partial = _ckpt(tmp_path, 1, complete=False)
    a, b, c = _ckpt(tmp_path, 2), _ckpt(tmp_path, 4), _ckpt(tmp_path, 6)
    in_progress = _ckpt(tmp_path, 8, complete=False)
    deleted = prune_checkpoints(tmp_path, 2)
    assert deleted == [old_partial, a]
    assert sorted(p.name for p in tmp_path.iterdir()) == [b.name, c.name, in_progress.name]
    assert prune_checkpoints(tmp_path, 1) == [b] and c.exists() and in_progress.exists()
    assert prune_checkpoints(tmp_path, 1) == []  # the latest complete one is never deleted
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, 0)


def test_keep_checkpoints_config_key():
    from deploy.config_sections import RunConfig

    assert RunConfig(keep_checkpoints=3).keep_checkpoints == 3
    with pytest.raises(ValueError, match="keep_checkpoints"):
        RunConfig(keep_checkpoints=0)
