"""Who owns the optimiser: DeepSpeed (ZeRO 0-3, bf16, multi-rank) or plain torch AdamW (one rank).

Both expose the same small interface, so `LearnerWorker` has one code path. This is the only
module that imports deepspeed (lazily, inside `DeepSpeedBackend`).

Gradient accumulation is owned by the caller: `backward(loss, is_boundary=...)` for each
micro-batch, then one `step()` per mini-batch. Losses arrive already divided by the global
denominator of the mini-batch, so no 1/grad_accum scaling happens here; DeepSpeed's mean over
data-parallel ranks is undone by multiplying by world_size (as verl does with dp_size).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from learner.config import LearnerConfig
from learner.lora import (
    adapter_module_states_only,
    apply_lora,
    is_adapter_param,
    is_lora_model,
    load_adapter_state,
)


class TrainBackend(Protocol):
    module: torch.nn.Module
    """The unwrapped HF model (its parameters are partitioned under ZeRO-3)."""
    device: torch.device

    def forward_module(self) -> torch.nn.Module: ...
    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...
    def backward(self, loss: torch.Tensor, *, is_boundary: bool) -> None: ...
    def step(self) -> float: ...
    def lr(self) -> float: ...
    def export_state_dict(self) -> dict[str, torch.Tensor] | None: ...
    def gathered(self, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager[Any]:
        """Inside: `params` hold their full values on every rank (a collective under ZeRO-3)."""
        ...
    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None: ...
    def load_checkpoint(self, path: Path) -> dict[str, Any]: ...


ModelLoader = Callable[[torch.device, "dict[str, Any] | None"], torch.nn.Module]
"""loader(device, zero3_config) -> the HF model on `device`; with a ZeRO-3 DeepSpeed config it must
build the model partitioned (`load_causal_lm`)."""


def weight_dtype(cfg: LearnerConfig) -> torch.dtype:
    """The dtype the weights are loaded in: bf16 for DeepSpeed bf16 (its optimiser keeps the fp32
    master copy), fp32 otherwise (torch bf16 runs under autocast with fp32 weights)."""
    return torch.bfloat16 if cfg.use_deepspeed and cfg.dtype == "bfloat16" else torch.float32


def load_causal_lm(
    model_path: str, *, dtype: torch.dtype, device: torch.device, zero3_config: dict[str, Any] | None = None
) -> torch.nn.Module:
    """An HF causal LM in `dtype`, loaded straight onto `device` (through transformers' device_map
    when accelerate is installed; otherwise loaded on the host in `dtype`, then moved). With a
    ZeRO-3 config it is constructed under `deepspeed.zero.Init`, so every parameter is partitioned
    over the ranks as it is created, and the checkpoint is copied in one parameter at a time
    (`_load_partitioned`): no rank ever holds the full model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if zero3_config is None:
        on_device = {"device_map": {"": str(device)}} if importlib.util.find_spec("accelerate") else {}
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **on_device)
        return model.to(device)
    import deepspeed
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(model_path)
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path=_zero_init_config(zero3_config, dtype)):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # every weight is loaded below
        model.tie_weights()  # no_init_weights skipped the tying that post_init would do
    _load_partitioned(model, Path(model_path))
    return model


def _zero_init_config(zero3_config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """The ZeRO-3 config with its precision set to `dtype`. zero.Init is given the dtype through the
    config, never through its `dtype` argument: DeepSpeed 0.19.8 ignores that argument on a CPU
    without oneDNN fp16 (AMD EPYC, say) and builds every parameter in bf16 (an operator-precedence
    slip in `Init._set_dtype`), which silently rounds fp32 weights and swallows small updates."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"ZeRO-3 loading supports float32, bfloat16 and float16 weights, got {dtype}")
    return {
        **zero3_config,
        "bf16": {**zero3_config.get("bf16", {}), "enabled": dtype == torch.bfloat16},
        "fp16": {**zero3_config.get("fp16", {}), "enabled": dtype == torch.float16},
    }


def _load_partitioned(model: torch.nn.Module, model_dir: Path) -> None:
    """Copy the safetensors checkpoint into a ZeRO-3-partitioned model: each parameter is gathered,
    filled from the (memory-mapped) file on rank 0 and re-partitioned. Every rank runs the same
    sequence of collectives."""
    import deepspeed
    import torch.distributed as dist
    from safetensors import safe_open

    params = dict(model.named_parameters())  # tied weights appear once
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors under {model_dir}: ZeRO-3 loading reads safetensors only")
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                param = params.get(key)
                if param is None:
                    continue  # a tied duplicate (lm_head.weight) or a buffer
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if dist.get_rank() == 0:
                        param.data.copy_(f.get_tensor(key).to(param.dtype))
                loaded.add(key)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{model_dir}: the checkpoint has no weights for {missing[:5]} ({len(missing)} missing)")


def _materialise(
    cfg: LearnerConfig, model: torch.nn.Module | ModelLoader, device: torch.device, zero3: dict[str, Any] | None
) -> torch.nn.Module:
    """The model on `device` (calling the loader when given one), wrapped in LoRA adapters with
    lora.enabled (`learner.lora.apply_lora`: the base frozen in its loaded dtype), with gradient
    checkpointing on when configured (non-reentrant: works with ZeRO-3 and with frozen inputs)."""
    if not isinstance(model, torch.nn.Module):
        model = model(device, zero3)
    if cfg.lora.enabled and not is_lora_model(model):
        model = apply_lora(model, cfg.lora, adapter_dtype_fp32=weight_dtype(cfg) == torch.float32)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _adamw(cfg: LearnerConfig, model: torch.nn.Module) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def _grad_norm(params) -> float:
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


class TorchBackend:
    """Single-process AdamW; bfloat16 runs the forward under autocast with fp32 weights."""

    def __init__(self, cfg: LearnerConfig, model: torch.nn.Module | ModelLoader, *, world_size: int = 1) -> None:
        if world_size != 1:
            raise ValueError("use_deepspeed=False supports world_size=1 only")
        self.device = assigned_device()
        self.module = _materialise(cfg, model, self.device, None).to(self.device)
        self.module.train()
        self._cfg = cfg
        self._optimizer = _adamw(cfg, self.module)

    def forward_module(self) -> torch.nn.Module:
        return self.module

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._cfg.dtype == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, *, is_boundary: bool) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self._cfg.grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self._cfg.grad_clip))
        else:
            norm = _grad_norm(params)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        return norm

    def lr(self) -> float:
        return float(self._optimizer.param_groups[0]["lr"])

    def export_state_dict(self) -> dict[str, torch.Tensor] | None:
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def gathered(self, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None:
        """learner.pt: the model (with LoRA only the adapter: the frozen base is the run's model),
        the optimiser state and `client_state`."""
        path.mkdir(parents=True, exist_ok=True)
        model = self.module.state_dict()
        if self._cfg.lora.enabled:
            model = {k: v for k, v in model.items() if is_adapter_param(k)}
        state = {
            "model": model,
            "optimizer": self._optimizer.state_dict(),
            "client_state": client_state,
        }
        tmp = path / "learner.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(path / "learner.pt")

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        state = torch.load(path / "learner.pt", map_location=self.device, weights_only=False)
        if self._cfg.lora.enabled:
            load_adapter_state(self.module, state["model"], path)
        else:
            self.module.load_state_dict(state["model"])
        self._optimizer.load_state_dict(state["optimizer"])
        return state["client_state"]


NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def cuda_ordinal(env: Mapping[str, str], assigned: Sequence[str | int], device_count: int) -> int:
    """The CUDA ordinal (index among this process's visible devices) of the GPU Ray assigned.

    `assigned`: `ray.get_gpu_ids()` (empty outside a Ray actor: the first visible GPU). Ray sets
    CUDA_VISIBLE_DEVICES to the assigned ids, so an actor with one GPU sees it as ordinal 0
    whatever its rank; the ordinal is the first assigned id's position in that list (its id when
    the variable is unset). With NOSET_VISIBLE_DEVICES Ray leaves the variable alone and every
    rank would see every GPU: refused, because nothing then says which GPU is this rank's."""
    if env.get(NOSET_VISIBLE_DEVICES, "") not in ("", "0"):
        raise RuntimeError(
            f"{NOSET_VISIBLE_DEVICES} is set: Ray then leaves CUDA_VISIBLE_DEVICES alone and every learner "
            f"rank sees every GPU; unset it so each rank sees only the GPU Ray assigned it"
        )
    if not assigned:
        return 0
    first = str(assigned[0])
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible is not None else [str(i) for i in range(device_count)]
    if first not in ids:
        raise RuntimeError(f"Ray assigned GPU {first}, but CUDA_VISIBLE_DEVICES={visible!r} does not list it")
    ordinal = ids.index(first)
    if ordinal >= device_count:
        raise RuntimeError(f"Ray assigned GPU {first} (ordinal {ordinal}), but torch sees {device_count} GPU(s)")
    return ordinal


def _ray_gpu_ids() -> list[str | int]:
    """The GPUs Ray assigned this process; [] outside a Ray worker."""
    import ray

    return list(ray.get_gpu_ids()) if ray.is_initialized() else []


def assigned_device() -> torch.device:
    """This process's training device: the GPU Ray assigned (`cuda_ordinal`), or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", cuda_ordinal(os.environ, _ray_gpu_ids(), torch.cuda.device_count()))


def set_distributed_env(
    *, rank: int, world_size: int, master_addr: str, master_port: int, local_rank: int | None = None
) -> None:
    """DeepSpeed reads these (without them it tries MPI discovery and fails). The explicit
    arguments overwrite values already in the environment: a stale WORLD_SIZE inherited from a
    parent process would otherwise silently start the wrong topology. LOCAL_RANK defaults to
    the ordinal of the GPU Ray assigned (`assigned_device`: 0 for a Ray actor that sees only its
    GPU), or rank on CPU."""
    if local_rank is None:
        local_rank = assigned_device().index if torch.cuda.is_available() else rank
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def init_process_group_on_node(rendezvous_file: str, *, rank: int, world_size: int, backend: str,
                               timeout_s: float | None = None) -> None:
    """The learner ranks' default process group. `rendezvous_file` is either
    - a path, when every rank shares one node: rendezvous through that file (torch's FileStore)
      instead of a TCPStore, which would listen on every interface, and collectives over loopback
      (GLOO_SOCKET_IFNAME = lo, unless the deployment sets it; NCCL_SOCKET_IFNAME is left to NCCL,
      because it is process-wide and the weight-sync group may have to reach engines on other
      nodes from this very process); or
    - "tcp://HOST:PORT", when the ranks span nodes (`deploy.topology.start_learners`): a TCPStore
      served by rank 0 at its node's address HOST, and collectives over the interface that reaches
      HOST (`_interface_towards`), unless the deployment sets the variables.
    DeepSpeed then finds the group initialised and keeps it. `timeout_s` bounds the rendezvous and
    every collective: a rank whose peer is gone raises instead of waiting forever (None: torch's
    default)."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    if rendezvous_file.startswith("tcp://"):
        host, _, port = rendezvous_file.removeprefix("tcp://").rpartition(":")
        ifname = _interface_towards(host, int(port))
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if ifname is not None:
                os.environ.setdefault(var, ifname)
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, **timeout)
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.FileStore(rendezvous_file, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **timeout)


def _interface_towards(host: str, port: int) -> str | None:
    """The name of this host's network interface whose address routes to `host` (no packet is
    sent: a UDP socket's connect only picks the route), or None when no interface holds it."""
    import socket

    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        local = sock.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def deepspeed_config(cfg: LearnerConfig, *, world_size: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_rows,
        "gradient_accumulation_steps": 1,  # boundaries are set explicitly per micro-batch
        "train_batch_size": cfg.micro_batch_rows * world_size,
        "gradient_clipping": cfg.grad_clip,
        "bf16": {"enabled": cfg.dtype == "bfloat16"},
        "zero_optimization": {
            "stage": cfg.zero_stage,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


class DeepSpeedBackend:
    """A DeepSpeed engine around the HF model with a client torch AdamW (no fused-adam JIT)."""

    def __init__(
        self,
        cfg: LearnerConfig,
        model: torch.nn.Module | ModelLoader,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        rendezvous_file: str | None = None,
        local_rank: int | None = None,
        collective_timeout_s: float | None = None,
    ) -> None:
        set_distributed_env(
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            local_rank=local_rank,
        )
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        if rendezvous_file is not None:
            init_process_group_on_node(rendezvous_file, rank=rank, world_size=world_size,
                                       backend=get_accelerator().communication_backend_name(),
                                       timeout_s=collective_timeout_s)

        local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device(get_accelerator().device_name(local_rank))
        self._cfg = cfg
        self._world_size = world_size
        self.ds_config = deepspeed_config(cfg, world_size=world_size)
        if cfg.zero_stage == 3:
            deepspeed.init_distributed()  # zero.Init partitions over the group: it must exist first
        model = _materialise(cfg, model, self.device, self.ds_config if cfg.zero_stage == 3 else None)
        if cfg.zero_stage != 3:
            model = model.to(self.device)
        self._engine, self._optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=_adamw(cfg, model),
            config=self.ds_config,
        )
        self.module = self._engine.module
        if cfg.lora.enabled:
            adapter_module_states_only(self._engine)
        self._engine.train()

    def forward_module(self) -> torch.nn.Module:
        return self._engine

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the engine holds bf16 weights itself

    def backward(self, loss: torch.Tensor, *, is_boundary: bool) -> None:
        self._engine.set_gradient_accumulation_boundary(is_boundary)
        self._engine.backward(loss * self._world_size, scale_wrt_gas=False)

    def step(self) -> float:
        # ZeRO and bf16 optimisers record the global norm; the plain fp32 stage-0 path does not.
        fallback = _grad_norm(self.module.parameters()) if self._records_no_norm() else 0.0
        self._engine.step()
        norm = self._engine.get_global_grad_norm()
        return float(norm) if norm is not None and not self._records_no_norm() else fallback

    def _records_no_norm(self) -> bool:
        return self._cfg.zero_stage == 0 and self._cfg.dtype == "float32"

    def lr(self) -> float:
        return float(self._engine.get_lr()[0])

    def export_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full weights on rank 0 (a collective under ZeRO-3: every rank must call it)."""
        if self._cfg.zero_stage == 3:
            return self._engine._zero3_consolidated_16bit_state_dict()
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def gathered(self, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager[Any]:
        if self._cfg.zero_stage != 3 or not params:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None:
        """DeepSpeed's checkpoint; with LoRA without the frozen base (DeepSpeed's
        exclude_frozen_parameters: the module states hold the adapter, the optimiser states only
        ever held it)."""
        tag = f"version_{client_state.get('version', 0)}"
        self._engine.save_checkpoint(str(path), tag=tag, client_state={"client_state": client_state},
                                     exclude_frozen_parameters=self._cfg.lora.enabled)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        load_path, state = self._engine.load_checkpoint(str(path), load_module_strict=not self._cfg.lora.enabled)
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {path}")
        return state["client_state"]


def build_reference(cfg: LearnerConfig, loader: ModelLoader, backend: TrainBackend) -> torch.nn.Module:
    """The frozen reference model, placed by `cfg.ref_placement`: "device" = a full copy on the
    backend's device; "cpu" = a full copy in host memory; "shard" = partitioned over the ranks
    under ZeRO-3 (built under zero.Init, wrapped in a DeepSpeed engine without an optimiser, so
    its parameters are gathered layer by layer in each forward). Every rank must call it."""
    if cfg.ref_placement == "shard":
        import deepspeed

        ds_config = getattr(backend, "ds_config", None)
        if ds_config is None:
            raise ValueError("ref_placement=shard needs the DeepSpeed ZeRO-3 backend")
        model = loader(backend.device, ds_config)
        engine, *_ = deepspeed.initialize(model=model.requires_grad_(False), config=ds_config)
        engine.eval()  # (DeepSpeedEngine.eval returns None)
        return engine
    device = torch.device("cpu") if cfg.ref_placement == "cpu" else backend.device
    return loader(device, None).eval().requires_grad_(False)


def build_backend(
    cfg: LearnerConfig,
    model: torch.nn.Module | ModelLoader,
    *,
    rank: int = 0,
    world_size: int = 1,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    rendezvous_file: str | None = None,
    local_rank: int | None = None,
    collective_timeout_s: float | None = None,
) -> TrainBackend:
    if cfg.use_deepspeed:
        return DeepSpeedBackend(
            cfg,
            model,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            rendezvous_file=rendezvous_file,
            local_rank=local_rank,
            collective_timeout_s=collective_timeout_s,
        )
    return TorchBackend(cfg, model, world_size=world_size)
