"""The sender's side of a model: its parameters as a header plus a stream, module by module.

Under ZeRO-3 each module's own parameters are gathered (`gather`, e.g. deepspeed's
`zero.GatheredParameters`, passed in by the learner) only while they are being copied into a
bucket, so no rank ever holds the whole model. Every learner rank must run the same stream (the
gathers are collectives); only weight-sync rank 0 sends what it yields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from weightsync.protocol import TensorMeta, metas_of

Gather = Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager]


def _module_params(model: torch.nn.Module, include: Callable[[str], bool] | None = None
                   ) -> list[tuple[list[str], list[torch.nn.Parameter]]]:
    """Per module (in `named_parameters` order): its own parameters, each once (a tied lm_head
    shares the embedding's parameter and is skipped, as `named_parameters` does); with `include`,
    only the parameters whose full name it accepts."""
    seen: set[int] = set()
    out = []
    for prefix, module in model.named_modules():
        names, params = [], []
        for name, p in module.named_parameters(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            if id(p) in seen or (include is not None and not include(full)):
                continue
            seen.add(id(p))
            names.append(full)
            params.append(p)
        if params:
            out.append((names, params))
    return out


def parameter_stream(model: torch.nn.Module, *, gather: Gather | None = None, dtype: torch.dtype | None = None,
                     include: Callable[[str], bool] | None = None, rename: Callable[[str], str] | None = None,
                     ) -> tuple[list[TensorMeta], Iterator[tuple[str, torch.Tensor]]]:
    """(header entries, stream of (name, full tensor)) for `model`'s parameters; `include` selects
    parameters by name (e.g. a LoRA adapter's), `rename` maps a parameter name to its wire name."""
    groups = _module_params(model, include)
    wire = rename or (lambda name: name)
    metas = metas_of([(wire(n), p) for names, params in groups for n, p in zip(names, params)], dtype=dtype)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for names, params in groups:
            with gather(params) if gather is not None else contextlib.nullcontext():
                for name, p in zip(names, params):
                    yield wire(name), p.data

    return metas, stream()
