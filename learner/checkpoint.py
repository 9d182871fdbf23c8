"""The learner's IO: HF weight export for the rollout engines and training checkpoints (model,
optimiser, policy version, RNG). Every rank calls each function (collectives under ZeRO);
the callers add the barrier."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from learner.backends import TrainBackend
from learner.lora import adapter_stream, hf_name, merged_stream
from weightsync.adapter import AdapterSpec, write_adapter_dir

MAX_SHARD_BYTES = 2 << 30
"""Largest safetensors file the export writes (HF's sharded layout + index beyond it)."""


def _export_tensors(backend: TrainBackend, *, rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) of every persistent weight, one module at a time: under ZeRO-3 only that
    module's parameters are gathered (every rank iterates; rank 0 receives the tensors, the
    others get nothing). Tied weights appear once, under their first name."""
    module = backend.module
    seen: set[int] = set()
    for prefix, sub in module.named_modules():
        params = [(n, p) for n, p in sub.named_parameters(recurse=False) if id(p) not in seen]
        transient = getattr(sub, "_non_persistent_buffers_set", set())
        buffers = [(n, b) for n, b in sub.named_buffers(recurse=False) if n not in transient]
        if not params and not buffers:
            continue
        seen.update(id(p) for _, p in params)
        with backend.gathered([p for _, p in params]):
            if rank == 0:
                for name, tensor in (*params, *buffers):
                    yield (f"{prefix}.{name}" if prefix else name), tensor.detach().to("cpu", copy=True)


def write_safetensors_shards(tensors: Iterable[tuple[str, torch.Tensor]], out: Path,
                             max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write (name, tensor) pairs as model.safetensors, or as model-0000k-of-0000n.safetensors +
    model.safetensors.index.json once they exceed `max_shard_bytes`; holds at most one shard in
    memory. Returns the file names written."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    written: list[Path] = []
    weight_map: dict[str, int] = {}
    total = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            written.append(out / f"shard-{len(written):05d}.tmp")
            save_file(shards[-1], str(written[-1]), metadata={"format": "pt"})
            shards[-1], size = {}, 0
        shards[-1][name] = tensor.contiguous()
        weight_map[name] = len(written)
        size += nbytes
        total += nbytes
    if not written:
        save_file(shards[-1], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    written.append(out / f"shard-{len(written):05d}.tmp")
    save_file(shards[-1], str(written[-1]), metadata={"format": "pt"})
    names = [f"model-{i + 1:05d}-of-{len(written):05d}.safetensors" for i in range(len(written))]
    for path, name in zip(written, names):
        path.rename(out / name)
    index = {"metadata": {"total_size": total}, "weight_map": {k: names[i] for k, i in weight_map.items()}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names


def merged_export_tensors(backend: TrainBackend, *, rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """`_export_tensors` of a LoRA model with its adapters merged in (`learner.lora.merged_stream`:
    HF names, W + scaling * B A), plus the base model's persistent buffers."""
    _, stream = merged_stream(backend.module, gather=backend.gathered)
    for name, tensor in stream:  # every rank iterates (ZeRO-3 gathers); rank 0 keeps the tensors
        if rank == 0:
            yield name, tensor.detach().to("cpu", copy=True)
    if rank == 0:
        for name, buf in backend.module.named_buffers():
            module_name, _, leaf = name.rpartition(".")
            owner = backend.module.get_submodule(module_name) if module_name else backend.module
            if leaf not in getattr(owner, "_non_persistent_buffers_set", set()):
                yield hf_name(name), buf.detach().to("cpu", copy=True)


def export_adapter_dir(backend: TrainBackend, spec: AdapterSpec, out_dir: str, *, rank: int,
                       base_model: str | None = None) -> Path:
    """Write a peft adapter directory (`weightsync.adapter.write_adapter_dir`) of the backend's
    LoRA model; every rank calls it (ZeRO-3 gathers one module's adapter at a time), rank 0 writes."""
    _, stream = adapter_stream(backend.module, gather=backend.gathered)
    tensors = {name: t.detach().to("cpu", copy=True) for name, t in stream}
    out = Path(out_dir)
    if rank == 0:
        write_adapter_dir(out, tensors, spec.peft_config(base_model=base_model))
    return out


def export_hf_dir(backend: TrainBackend, tokenizer: Any, out_dir: str, *, rank: int,
                  max_shard_bytes: int = MAX_SHARD_BYTES,
                  tensors: Iterator[tuple[str, torch.Tensor]] | None = None) -> Path:
    """Write an HF directory (safetensors + config + tokenizer) that vLLM and transformers load,
    from the learner ranks straight to `out_dir` (shared storage on a cluster: nothing passes
    through the driver). Module by module (`_export_tensors`, or `tensors` when given, e.g.
    `merged_export_tensors`): under ZeRO-3 no rank gathers the whole model, and rank 0 holds at
    most one shard. Every rank calls it; rank 0 writes to a temporary sibling and renames it into
    place, so readers never see a half-written directory."""
    out = Path(out_dir)
    tensors = _export_tensors(backend, rank=rank) if tensors is None else tensors
    if rank != 0:
        for _ in tensors:  # yields nothing here; the other ranks take part in each module's gather
            pass
        return out
    tmp = out.with_name(f"{out.name}.tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_safetensors_shards(tensors, tmp, max_shard_bytes)
    backend.module.config.save_pretrained(tmp)
    generation = getattr(backend.module, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(tmp)
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


def prune_checkpoints(root: str | Path, keep: int, *, marker: str = "trainer_state.json") -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints under `root` (step_* directories that
    hold `marker`, written last), and incomplete ones older than the newest complete one (left by
    a crash). Never deletes the newest complete checkpoint, nor anything newer than it (a save in
    progress). Returns the deleted directories, oldest first."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the latest complete checkpoint is never deleted), got {keep}")
    steps = sorted(p for p in Path(root).glob("step_*") if p.is_dir())
    complete = [p for p in steps if (p / marker).exists()]
    if not complete:
        return []
    kept = set(complete[-keep:])
    doomed = [p for p in steps if p not in kept and p.name < complete[-1].name]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
