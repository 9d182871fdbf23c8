"""Learner state off the device while colocated engines generate (docs/architecture.md
"Placement"): parameters, gradients and optimiser state go to host memory (pinned on CUDA, so the
copy back is a DMA) and come back before the next update.

- DeepSpeed ZeRO 1-3: the engine's own `offload_states` / `reload_states` (installed
  deepspeed/runtime/engine.py `DeepSpeedEngine.offload_states`, which calls the ZeRO optimiser's:
  runtime/zero/stage_1_and_2.py and stage3.py `offload_states`: low- and high-precision
  parameters, optimiser states, contiguous gradient buffers; `reload_states` moves them back to
  the accelerator). It refuses an engine whose parameters are already offloaded by the ZeRO
  config (`offload_param`), which the learner never sets; under ZeRO-3 it moves optimiser state
  and fp32 partitions only for DeepSpeed's FusedAdam, so with the learner's torch AdamW those two
  move here, tensor by tensor.
- ZeRO 0 and TorchBackend: the same three kinds of state, moved tensor by tensor (the module's
  parameters and gradients, the torch optimiser's per-parameter state).
- The frozen reference model (kl_coef > 0, a separate copy) moves with them.

On a CPU device every move is to the memory it already lives in: the calls run (and are timed),
the footprint does not change; what they free on a GPU is bench/gpu_check.py's measurement.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Moved:
    """One offload or reload: seconds and the learner's device-resident bytes after it."""

    seconds: float
    device_bytes: int


def _host(device: torch.device) -> torch.device:
    return torch.device("cpu")


def _move(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device == device:
        return t
    if device.type == "cpu" and t.is_cuda:
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out
    return t.to(device, non_blocking=True)


def _module_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    for p in module.parameters():
        yield p.data
        if p.grad is not None:
            yield p.grad
    yield from (b for b in module.buffers())


def _move_module(module: torch.nn.Module, device: torch.device) -> None:
    for p in module.parameters():
        p.data = _move(p.data, device)
        if p.grad is not None:
            p.grad = _move(p.grad, device)
    for m in module.modules():
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = _move(b, device)


def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:  # AdamW's step counter stays where it is
                state[key] = _move(value, device)


def _torch_optimizer(optimizer) -> torch.optim.Optimizer | None:
    """The torch optimiser under DeepSpeed's stage-0 wrappers (or the optimiser itself)."""
    while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = getattr(optimizer, "optimizer", None)
    return optimizer


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class LearnerOffload:
    """Offload and reload one learner rank's training state (`backend`: a TorchBackend or a
    DeepSpeedBackend of learner.backends; `reference`: the frozen reference model, or None)."""

    def __init__(self, backend, reference: torch.nn.Module | None = None) -> None:
        self.backend, self.reference = backend, reference
        self.device: torch.device = backend.device
        self.offloaded = False

    def _engine(self):
        """DeepSpeed's engine when its optimiser moves its own states (ZeRO 1-3), else None."""
        engine = getattr(self.backend, "_engine", None)
        if engine is None or not hasattr(engine.optimizer, "offload_states"):
            return None
        return engine

    def _zero3(self) -> bool:
        cfg = getattr(self.backend, "_cfg", None)
        return bool(cfg is not None and cfg.use_deepspeed and cfg.zero_stage == 3)

    def _deepspeed_states(self):
        """What DeepSpeed moves itself: everything, except under ZeRO-3 its fp32 partitions and
        optimiser state, whose offload it allows only for its FusedAdam (runtime/zero/stage3.py
        `offload_states`); the learner's torch AdamW state moves in `_move_zero3_optimizer`."""
        if not self._zero3():
            return None
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

        return {State.lp_params, State.lp_grads, State.contiguous_grad_buffer}

    def _move_zero3_optimizer(self, device: torch.device) -> None:
        if not self._zero3():
            return
        zero = self.backend._engine.optimizer
        for flat in zero.fp32_partitioned_groups_flat:
            flat.data = _move(flat.data, device)
        optimizer = _torch_optimizer(zero)
        if optimizer is not None:
            _move_optimizer(optimizer, device)

    def _modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.backend.module, self.reference) if m is not None]

    def _optimizer(self):
        engine = getattr(self.backend, "_engine", None)
        return _torch_optimizer(engine.optimizer if engine is not None else getattr(self.backend, "_optimizer", None))

    def offload(self) -> Moved:
        """Every kind of training state to host memory; idempotent."""
        start = time.perf_counter()
        if not self.offloaded:
            engine = self._engine()
            if engine is not None:
                engine.offload_states(include=self._deepspeed_states(), pin_memory=self.device.type == "cuda")
                self._move_zero3_optimizer(_host(self.device))
                if self.reference is not None:
                    _move_module(self.reference, _host(self.device))
            else:
                for module in self._modules():
                    _move_module(module, _host(self.device))
                optimizer = self._optimizer()
                if optimizer is not None:
                    _move_optimizer(optimizer, _host(self.device))
            _synchronize(self.device)
            self.offloaded = True
        return Moved(time.perf_counter() - start, self.device_bytes())

    def reload(self) -> Moved:
        """Everything `offload` moved back to the training device; idempotent."""
        start = time.perf_counter()
        if self.offloaded:
            engine = self._engine()
            if engine is not None:
                engine.reload_states()
                self._move_zero3_optimizer(self.device)
                if self.reference is not None:
                    _move_module(self.reference, self.device)
            else:
                for module in self._modules():
                    _move_module(module, self.device)
                optimizer = self._optimizer()
                if optimizer is not None:
                    _move_optimizer(optimizer, self.device)
            _synchronize(self.device)
            self.offloaded = False
        return Moved(time.perf_counter() - start, self.device_bytes())

    def device_bytes(self) -> int:
        """Device memory the learner holds: CUDA's allocated bytes on a GPU; on CPU the bytes of
        the module, gradient and optimiser tensors (host memory is the device there)."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        seen: set[int] = set()
        total = 0
        optimizer = self._optimizer()
        state = [v for s in optimizer.state.values() for v in s.values()] if optimizer is not None else []
        for t in [*(t for m in self._modules() for t in _module_tensors(m)), *state]:
            if isinstance(t, torch.Tensor) and t.device == self.device and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total
