"""A LoRA adapter as it travels from the learner to the engines: peft's tensor names, its
adapter_config.json, and the directory layout both peft and vLLM load.

Tensor names are peft's adapter state-dict keys, `base_model.model.<module>.lora_A.weight` and
`.lora_B.weight` (the parameter name without its adapter name, `peft.get_peft_model_state_dict`'s
convention): what a peft adapter directory's adapter_model.safetensors holds, what
`peft.set_peft_model_state_dict` takes and what vLLM's `LoRAModel.from_local_checkpoint` reads.
The adapter's configuration travels beside the tensors as `AdapterSpec` (a sync sends the tensors
over the weight-sync protocol unchanged; the spec is an argument of the receiving call).

Pure (no peft, no vLLM): the learner and both engines import it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"
"""peft's name of the one adapter the learner trains (it appears in parameter names only)."""


@dataclass(frozen=True)
class AdapterSpec:
    """The shape of the adapter: what `peft.LoraConfig` and vLLM's `PEFTHelper` need."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    dropout: float = 0.0

    def peft_config(self, base_model: str | None = None) -> dict[str, Any]:
        """adapter_config.json's content (peft's LoraConfig fields; vLLM reads r, lora_alpha,
        target_modules, bias, use_rslora, use_dora)."""
        return {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": self.rank, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
            "target_modules": sorted(self.target_modules), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "inference_mode": True,
        }  # fmt: skip

    @classmethod
    def from_peft_config(cls, config: Mapping[str, Any]) -> AdapterSpec:
        """The spec of an adapter_config.json (refuses what the engines cannot apply)."""
        if config.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{ADAPTER_CONFIG}: peft_type {config.get('peft_type')!r} is not LORA")
        for key in ("use_dora", "use_rslora"):
            if config.get(key):
                raise ValueError(f"{ADAPTER_CONFIG}: {key}=true is not supported (plain LoRA only)")
        if config.get("bias", "none") != "none":
            raise ValueError(f"{ADAPTER_CONFIG}: bias={config.get('bias')!r} is not supported (bias: none only)")
        targets = config["target_modules"]
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        return cls(rank=int(config["r"]), alpha=float(config["lora_alpha"]), target_modules=targets,
                   dropout=float(config.get("lora_dropout", 0.0)))


def wire_name(param_name: str, adapter: str = ADAPTER_NAME) -> str:
    """peft parameter name -> adapter state-dict key: `...q_proj.lora_A.default.weight` ->
    `...q_proj.lora_A.weight`."""
    for part in ("lora_A", "lora_B"):
        marker = f".{part}.{adapter}."
        if marker in param_name:
            return param_name.replace(marker, f".{part}.")
    raise ValueError(f"{param_name!r} is not a LoRA parameter of adapter {adapter!r}")


def is_adapter_files(names: Iterable[str]) -> bool:
    """Whether a set of exported file names is a peft adapter directory (not a full HF model)."""
    return ADAPTER_CONFIG in set(names)


def write_adapter_dir(out: str | Path, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> Path:
    """A peft adapter directory at `out` (adapter_config.json + adapter_model.safetensors), written
    to a sibling and renamed into place, so a reader never sees half of it."""
    from safetensors.torch import save_file

    out = Path(out)
    tmp = out.with_name(f"{out.name}.tmp-adapter")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(dict(config), indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_adapter_dir(path: str | Path) -> tuple[dict[str, torch.Tensor], AdapterSpec]:
    """The tensors and spec of a peft adapter directory."""
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    return load_file(str(path / ADAPTER_WEIGHTS)), AdapterSpec.from_peft_config(config)
