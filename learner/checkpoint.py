"""The learner's IO: HF weight export for the rollout engines and training checkpoints (model,
optimiser, policy version, RNG). Every rank calls each function (collectives under ZeRO);
the callers add the barrier."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from learner.backends import TrainBackend


def export_hf_dir(backend: TrainBackend, tokenizer: Any, out_dir: str, *, rank: int) -> Path:
    """Write an HF directory (safetensors + config + tokenizer) that vLLM and transformers load.
    The full state dict is gathered on every rank (a collective under ZeRO-3); rank 0 writes it to
    a temporary sibling and renames it into place, so readers never see a half-written directory."""
    state = backend.export_state_dict()
    out = Path(out_dir)
    if rank == 0:
        assert state is not None
        tmp = out.with_name(f"{out.name}.tmp-export")
        shutil.rmtree(tmp, ignore_errors=True)
        backend.module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def save_training_state(backend: TrainBackend, ckpt_dir: str, *, version: int) -> None:
    """Model + optimiser state (the backend's format) + policy version + Python and torch RNG."""
    client = {
        "version": version,
        "python_rng": random.getstate(),
        "torch_rng": torch.get_rng_state(),
    }
    backend.save_checkpoint(Path(ckpt_dir), client)


def load_training_state(backend: TrainBackend, ckpt_dir: str) -> int:
    """Restore what `save_training_state` wrote (RNG included); returns the policy version."""
    client = backend.load_checkpoint(Path(ckpt_dir))
    random.setstate(client["python_rng"])
    torch.set_rng_state(client["torch_rng"])
    return int(client["version"])
