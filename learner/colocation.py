"""A learner rank's side of colocated placement (docs/architecture.md "Placement"), mixed into the
learner actor: offload and reload its training state between the phases (`learner.offload`) and
hand the current weights to the engine rank on its own device in place (`weightsync.ipc`).

Every rank exports: each is paired with one engine rank (rank = engine x tp + engine rank), and
each engine rank loads the full tensors its own `load_weights` shards, as over the broadcast
path. Under ZeRO-3 each module is gathered by every rank (a collective) just long enough to be
copied into a bucket.
"""

from __future__ import annotations

import torch

from learner.offload import LearnerOffload, Moved
from learner.weight_sender import STREAMS, _zero3_gather
from weightsync.ipc import Handover, HandoverExporter
from weightsync.protocol import dtype_of


def device_used_bytes(device: torch.device) -> int | None:
    """Memory in use on the whole device (every process on it: the engine's too); None off CUDA."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


class ColocatedLearner:
    """Mixin for `learner.worker.LearnerWorker` (uses its `backend`, `ref_model` and `cfg`)."""

    def _offloader(self) -> LearnerOffload:
        if getattr(self, "_offload", None) is None:
            self._offload = LearnerOffload(self.backend, getattr(self, "ref_model", None))
        return self._offload

    def _report(self, moved: Moved) -> dict[str, float]:
        out = {"seconds": moved.seconds, "learner_bytes": float(moved.device_bytes)}
        used = device_used_bytes(self.backend.device)
        if used is not None:
            out["device_used_bytes"] = float(used)
        return out

    def offload_states(self) -> dict[str, float]:
        """Parameters, gradients, optimiser state (and a separate reference) to host memory."""
        return self._report(self._offloader().offload())

    def reload_states(self) -> dict[str, float]:
        """Everything `offload_states` moved, back on the training device."""
        return self._report(self._offloader().reload())

    @torch.no_grad()
    def export_handover(self, wire_dtype: str | None = None, bucket_mb: float = 256.0,
                        timeout_s: float = 600.0) -> Handover:
        """Start streaming the current weights (cast to `wire_dtype`) through a ring of two
        `bucket_mb` slots on this rank's device and return its handle; the rest of the stream runs in
        the background as the engine frees slots, and the ring stays until `release_handover`.
        Under ZeRO-3 every bucket is staged before it returns. Every rank calls it."""
        if getattr(self, "_exporter", None) is None:
            self._exporter = HandoverExporter(self.backend.device)
        lora = self.cfg.lora
        if lora.enabled and not lora.merge_on_sync:
            raise ValueError("the in-place handover sends full weights: set learner.lora.merge_on_sync=true")
        what = "merged" if lora.enabled else "full"
        gather = _zero3_gather(self.cfg)
        metas, stream = STREAMS[what](self.backend.module, gather=gather, dtype=dtype_of(wire_dtype) if wire_dtype else None)
        # ZeRO-3's gathers are collectives: they stay on this actor's thread, all staged before the
        # call returns (the whole model on the device until the release), so that a recovery call
        # meanwhile (an object-store export for a restarted engine) cannot interleave with them
        return self._exporter.export(metas, stream, bucket_bytes=int(bucket_mb * (1 << 20)), timeout_s=timeout_s,
                                     background=gather is None)

    def release_handover(self) -> int:
        """Free the ring of the last `export_handover` (the engine has loaded every chunk); raises
        what failed the background stream, if anything did."""
        exporter = getattr(self, "_exporter", None)
        return exporter.release() if exporter is not None else 0
