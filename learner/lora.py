"""LoRA on the learner (`learner.lora`, docs/algorithms.md "LoRA"), the one module that imports peft.

- `apply_lora` wraps the loaded base in peft's LoRA layers: the base parameters are frozen (no
  gradient, no optimizer state) and stay in the dtype they were loaded in; only lora_A / lora_B
  train.
- `adapters_disabled`: the reference model is the base with the adapters switched off (peft's
  `disable_adapter`: every LoRA layer returns its base layer's output, the exact ops of the base
  model), so no second copy of the weights exists.
- `adapter_stream` / `merged_stream`: what a weight sync sends, as (header entries, stream of
  (name, full tensor)) for `weightsync.protocol.send_weights`, module by module (ZeRO-3 gathers one
  module's parameters at a time, as `weightsync.stream.parameter_stream`). Adapter-only: the
  lora_A/lora_B tensors under peft's state-dict names (`weightsync.adapter`). Merged
  (`lora.merge_on_sync`): every base weight under its plain HF name, with W + (alpha/r) B A in
  place of each adapted weight, exactly what the full-weight stream of the same model would send.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from learner.config import LoraConfig
from weightsync.adapter import ADAPTER_NAME, AdapterSpec, wire_name
from weightsync.protocol import TensorMeta, metas_of
from weightsync.stream import Gather, parameter_stream

PEFT_PREFIX = "base_model.model."
"""What peft puts before every name of the wrapped model."""


def adapter_spec(cfg: LoraConfig) -> AdapterSpec:
    return AdapterSpec(rank=cfg.rank, alpha=cfg.alpha, target_modules=tuple(cfg.target_modules), dropout=cfg.dropout)


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, *, adapter_dtype_fp32: bool) -> torch.nn.Module:
    """`model` (an HF causal LM, possibly ZeRO-3-partitioned) wrapped in peft LoRA layers on
    `cfg.target_modules`. lora_A is initialised by peft (Kaiming-uniform from torch's RNG: seed it
    first), lora_B is zero, so the wrapped model starts equal to the base. `adapter_dtype_fp32`:
    adapters in float32 whatever the base dtype (peft's autocast_adapter_dtype; the torch backend
    keeps fp32 weights anyway), otherwise in the base's dtype (DeepSpeed bf16 keeps the fp32 master
    copy in its optimizer)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                              target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    try:
        wrapped = get_peft_model(model, peft_cfg, autocast_adapter_dtype=adapter_dtype_fp32)
    except ValueError as err:
        raise ValueError(f"learner.lora.target_modules={list(cfg.target_modules)}: {err}") from err
    return wrapped


def is_lora_model(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "disable_adapter", None))


def adapters_disabled(model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """Inside: `model` (the peft model, or a DeepSpeed engine around it) computes the base model."""
    inner = getattr(model, "module", model)
    return inner.disable_adapter()


def is_adapter_param(name: str) -> bool:
    return f".lora_A.{ADAPTER_NAME}." in name or f".lora_B.{ADAPTER_NAME}." in name


def load_adapter_state(module: torch.nn.Module, state: dict[str, torch.Tensor], where: object) -> None:
    """Copy a LoRA checkpoint's adapter tensors into `module`; refuses a checkpoint that is not an
    adapter checkpoint of this adapter shape (a full-weight checkpoint, another rank or targets)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    absent = [k for k in missing if is_adapter_param(k)]
    if unexpected or absent:
        raise ValueError(f"{where}: not a LoRA checkpoint of this learner.lora (unexpected {unexpected[:3]}, "
                         f"missing adapter tensors {absent[:3]}): resume with the learner.lora it was saved with")


def adapter_module_states_only(engine: Any) -> None:
    """A LoRA DeepSpeed engine's checkpoints keep the adapter's module states only. DeepSpeed's
    exclude_frozen_parameters drops frozen parameters by their `named_parameters` names, which skip
    a tied lm_head: the embedding would be saved again under the head's name."""
    states = engine.module_state_dict
    engine.module_state_dict = lambda *args, **kw: {k: v for k, v in states(*args, **kw).items()
                                                    if is_adapter_param(k)}


def adapter_stream(model: torch.nn.Module, *, gather: Gather | None = None, dtype: torch.dtype | None = None
                   ) -> tuple[list[TensorMeta], Iterator[tuple[str, torch.Tensor]]]:
    """The adapter tensors of the peft `model` under peft's state-dict names."""
    return parameter_stream(model, gather=gather, dtype=dtype, include=is_adapter_param, rename=wire_name)


def hf_name(peft_name: str) -> str:
    """peft model name -> the base model's own name (`base_model.model.X.base_layer.weight` -> `X.weight`)."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {prefix: m for prefix, m in model.named_modules() if isinstance(m, LoraLayer)}


def _merged_groups(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module | None, list[tuple[str, torch.nn.Parameter]]]]:
    """Per module in order: (its LoRA-layer prefix or "", the LoRA layer or None, [(peft name, param)])
    of the parameters a merged stream needs; tied parameters once; a LoRA layer's children are
    folded into the layer."""
    layers = _lora_layers(model)
    seen: set[int] = set()
    groups = []
    for prefix, module in model.named_modules():
        if any(prefix.startswith(f"{p}.") for p in layers):
            continue
        if prefix in layers:
            params = [(f"{prefix}.{n}", p) for n, p in module.named_parameters() if id(p) not in seen]
            seen.update(id(p) for _, p in params)
            groups.append((prefix, module, params))
            continue
        own = [(f"{prefix}.{n}" if prefix else n, p) for n, p in module.named_parameters(recurse=False)
               if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        if own:
            groups.append(("", None, own))
    return groups


def merged_stream(model: torch.nn.Module, *, gather: Gather | None = None, dtype: torch.dtype | None = None
                  ) -> tuple[list[TensorMeta], Iterator[tuple[str, torch.Tensor]]]:
    """The base model's parameters under their HF names with every adapter merged in:
    W' = W + scaling * B A (peft's `get_delta_weight`), computed in float32 and cast to `dtype`
    (None: the base weight's dtype). The model itself is not changed."""
    groups = _merged_groups(model)
    named: list[tuple[str, torch.Tensor]] = []
    for _, layer, params in groups:
        for name, p in params:
            if layer is None or ".base_layer." in name:
                named.append((hf_name(name), p))
    metas = metas_of(named, dtype=dtype)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for _, layer, params in groups:
            with gather([p for _, p in params]) if gather is not None else contextlib.nullcontext():
                for name, p in params:
                    if layer is None:
                        yield hf_name(name), p.data
                    elif name.endswith(".base_layer.weight"):
                        delta = layer.get_delta_weight(ADAPTER_NAME).float()
                        yield hf_name(name), (p.data.float() + delta).to(p.dtype)
                    elif ".base_layer." in name:
                        yield hf_name(name), p.data

    return metas, stream()
