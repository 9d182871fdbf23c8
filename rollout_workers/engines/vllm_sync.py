"""vLLM worker extension for collective weight sync (`worker_extension_cls`; its methods run on
every vLLM worker through `LLM.collective_rpc`, in-process or in vLLM's worker processes alike).

Each vLLM worker is its own member of the weight-sync group (rank = the engine's base rank + the
worker's rank inside the engine, so every tensor-parallel shard receives the full tensors and its
own `load_weights` slices them). Received buckets feed vLLM's in-place reload
(`Worker.reload_weights(weights_iterator=...)`: the model's own `load_weights`, wrapped layer by
layer so kernel-format post-processing is redone), then the CPU backend's packed copy of a tied
lm_head is refreshed (`repack_lm_head`, see engines/vllm_engine.py). No file is written.

On a model with tied embeddings vLLM's reload warns "ParallelLMHead: Failed to load weights" at
every sync: the stream carries the embedding once (as the learner's state dict does), the tied
head receives nothing under its own name and vLLM puts its kernel tensors back, which are the
embedding's, just reloaded. `TiedHeadReloadFilter` drops that one line on such models.

A stream that fails mid-way (a peer died: `WeightSyncError`) leaves vLLM's reload unfinished:
`initialize_layerwise_reload` (vllm/model_executor/model_loader/reload/layerwise.py) first moves
every layer to the meta device and only `finalize_layerwise_reload` puts back the layers that
received nothing, and `reload_weights` (reload/inplace.py) does not reach it when the iterator
raises. `finish_interrupted_reload` runs it, so every layer holds real tensors again (the old
weights, or the new ones for layers that arrived whole); the driver then reloads every engine
through the object store. An engine whose finalisation fails, or that still holds a meta tensor,
ends its process (`abandon_engine`): Ray restarts the rollout worker, never a half-reloaded engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch

from weightsync.adapter import write_adapter_dir
from weightsync.group import GroupSpec, WeightGroup
from weightsync.ipc import open_handover
from weightsync.protocol import receive_weights, release_cached_memory

WORKER_EXTENSION = "rollout_workers.engines.vllm_sync.WeightSyncExtension"


def repack_lm_head(worker) -> bool:
    """Redo the unquantized lm_head's post-load processing on one vLLM worker (on CPU it packs a
    private copy of the weight for its GEMM kernel; elsewhere it is a no-op)."""
    model = _runner(worker).get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if type(method).__name__ != "UnquantizedEmbeddingMethod":
        return False
    method.process_weights_after_loading(head)
    return True


HALF_RELOADED_EXIT = 75
"""Exit status of an engine process that could not finish an interrupted reload."""

log = logging.getLogger(__name__)


def _runner(worker):
    return getattr(worker, "worker", worker).model_runner


def meta_tensors(model: torch.nn.Module) -> list[str]:
    """Names of parameters and buffers still on the meta device (a reload left unfinished)."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return [name for name, t in named if t.is_meta]


def finish_interrupted_reload(worker) -> None:
    """Finalise vLLM's layerwise reload after its weight stream failed: layers that received
    nothing get their kernel tensors back, partly received ones are processed as they are.
    Raises when a tensor is still on the meta device afterwards."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    runner = _runner(worker)
    model = runner.get_model()
    with set_current_vllm_config(runner.vllm_config):
        finalize_layerwise_reload(model, runner.vllm_config.model_config)
    repack_lm_head(worker)
    left = meta_tensors(model)
    if left:
        raise RuntimeError(f"{len(left)} tensor(s) still on the meta device after finalising, e.g. {left[0]}")


def abandon_engine(reason: str) -> None:
    """End this process (Ray restarts the rollout worker that held it with the current weights)."""
    log.error("weight sync left this engine half-reloaded (%s); exiting so that it is restarted", reason)
    logging.shutdown()
    os._exit(HALF_RELOADED_EXIT)


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layerwise reload (`model_loader/reload/layerwise.py`)."""


class TiedHeadReloadFilter(logging.Filter):
    """Drops vLLM's reload warning about the lm_head of a tied-embedding model (harmless there: the
    head shares the embedding's weight, which the same sync reloaded); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("ParallelLMHead",))


def ties_lm_head(model: torch.nn.Module) -> bool:
    """Whether the model's lm_head shares its weight with the input embedding."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    return weight is not None and weight is getattr(embed, "weight", None)


def silence_tied_head_warning(model: torch.nn.Module) -> bool:
    """Install `TiedHeadReloadFilter` on vLLM's reload logger (once) when `model` ties its lm_head;
    returns whether it did (an untied head that fails to load stays a warning)."""
    if not ties_lm_head(model):
        return False
    logger = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, TiedHeadReloadFilter) for f in logger.filters):
        logger.addFilter(TiedHeadReloadFilter())
    return True


class WeightSyncExtension:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def weight_sync_join(self, spec: GroupSpec, base_rank: int) -> int:
        """Join `spec`'s group as rank base_rank + this worker's rank in its engine (blocks until
        every member has joined, at most spec.timeout_s). Replaces an earlier membership."""
        if isinstance(spec, dict):  # AsyncLLM's RPC to the engine-core process sends dataclasses as dicts
            spec = GroupSpec(**{**spec, "members": tuple(spec["members"])})
        self.weight_sync_close()
        rank = base_rank + int(getattr(self, "rank", 0))
        device = getattr(self, "device", None)
        if not isinstance(device, torch.device) or device.type not in ("cuda", "cpu"):
            device = None
        self._weight_group = WeightGroup(spec, rank, device=device)
        silence_tied_head_warning(_runner(self).get_model())
        return rank

    def weight_sync_receive(self) -> int:
        """Receive one full set of weights from rank 0 and load it in place; returns the number of
        tensors loaded."""
        group = getattr(self, "_weight_group", None)
        if group is None:
            raise RuntimeError("weight_sync_receive before weight_sync_join")
        count = 0

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for bucket in receive_weights(group):
                for name, tensor in bucket:
                    count += 1
                    yield name, tensor.clone()  # the layerwise reload may hold it past this bucket

        try:
            self.reload_weights(weights_iterator=stream(), is_checkpoint_format=True)
            repack_lm_head(self)
        except Exception:
            self._weight_sync_recover(group)
            raise
        finally:
            release_cached_memory()
        return count

    def weight_handover_receive(self, handovers: list) -> int:
        """Colocated placement: load handovers[this worker's rank] (the learner rank on this
        worker's device exported it, `weightsync.ipc`) through the same in-place reload as a
        broadcast; returns the number of tensors loaded."""
        handover = handovers[int(getattr(self, "rank", 0))]
        count = 0

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for bucket in open_handover(handover):
                for name, tensor in bucket:
                    count += 1
                    yield name, tensor.clone()  # the layerwise reload may hold it past this bucket

        chunks = stream()
        try:
            self.reload_weights(weights_iterator=chunks, is_checkpoint_format=True)
            repack_lm_head(self)
        except Exception as err:
            chunks.close()  # tells the learner's side to stop now, not after its timeout
            try:
                finish_interrupted_reload(self)
            except Exception as again:  # noqa: BLE001 - the engine cannot serve: restart it
                abandon_engine(f"{type(again).__name__}: {again} (after {type(err).__name__})")
            raise
        finally:
            release_cached_memory()
        return count

    def weight_sync_receive_adapter(self, out_dir: str, config: dict) -> int:
        """Receive one broadcast LoRA adapter (the tensors only: the base is untouched) and, on the
        engine's first worker, write it as a peft directory at `out_dir` with adapter_config.json
        `config`, which the engine then loads as a vLLM adapter (`VLLMEngine.receive_adapter`).
        A failed receive aborts the group and leaves the serving adapter as it was."""
        group = getattr(self, "_weight_group", None)
        if group is None:
            raise RuntimeError("weight_sync_receive_adapter before weight_sync_join")
        try:
            tensors = {name: t.clone() for bucket in receive_weights(group) for name, t in bucket}
        except Exception:
            self._weight_group = None
            group.abort()
            raise
        finally:
            release_cached_memory()
        if int(getattr(self, "rank", 0)) == 0:
            write_adapter_dir(out_dir, tensors, config)
        return len(tensors)

    def _weight_sync_recover(self, group: WeightGroup) -> None:
        """After a failed receive: the group is aborted (the sender stops waiting for this rank) and
        the reload finalised, or this process ends (`abandon_engine`)."""
        self._weight_group = None
        group.abort()
        try:
            finish_interrupted_reload(self)
        except Exception as err:  # noqa: BLE001 - the engine cannot serve: restart it
            abandon_engine(f"{type(err).__name__}: {err}")

    def weight_sync_repack(self) -> bool:
        """`repack_lm_head` on this worker, by name (the async engine's RPC cannot ship a function)."""
        return repack_lm_head(self)

    def weight_sync_close(self) -> None:
        group = getattr(self, "_weight_group", None)
        self._weight_group = None
        if group is not None:
            group.close()
