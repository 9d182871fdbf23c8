"""vLLM worker extension for collective weight sync (`worker_extension_cls`; its methods run on
every vLLM worker through `LLM.collective_rpc`, in-process or in vLLM's worker processes alike).

Each vLLM worker is its own member of the weight-sync group (rank = the engine's base rank + the
worker's rank inside the engine, so every tensor-parallel shard receives the full tensors and its
own `load_weights` slices them). Received buckets feed vLLM's in-place reload
(`Worker.reload_weights(weights_iterator=...)`: the model's own `load_weights`, wrapped layer by
layer so kernel-format post-processing is redone), then the CPU backend's packed copy of a tied
lm_head is refreshed (`repack_lm_head`, see engines/vllm_engine.py). No file is written.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from weightsync.group import GroupSpec, WeightGroup
from weightsync.protocol import receive_weights

WORKER_EXTENSION = "rollout_workers.engines.vllm_sync.WeightSyncExtension"


def repack_lm_head(worker) -> bool:
    """Redo the unquantized lm_head's post-load processing on one vLLM worker (on CPU it packs a
    private copy of the weight for its GEMM kernel; elsewhere it is a no-op)."""
    model = getattr(worker, "worker", worker).model_runner.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if type(method).__name__ != "UnquantizedEmbeddingMethod":
        return False
    method.process_weights_after_loading(head)
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

        self.reload_weights(weights_iterator=stream(), is_checkpoint_format=True)
        repack_lm_head(self)
        return count

    def weight_sync_repack(self) -> bool:
        """`repack_lm_head` on this worker, by name (the async engine's RPC cannot ship a function)."""
        return repack_lm_head(self)

    def weight_sync_close(self) -> None:
        group = getattr(self, "_weight_group", None)
        self._weight_group = None
        if group is not None:
            group.close()
