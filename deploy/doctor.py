"""What a run needs before any actor starts (`python -m deploy doctor`, and `train` first): one
`Check` per need, each ok, warn or FAIL with the fix.

The `check_*` functions are pure: they judge facts passed in. `preflight` gathers the facts (GPUs
per node, the torch build, NCCL, files, the critic's socket, free ports) for the checks that apply
to the config: GPU checks only when the config asks for GPUs, so a CPU config never fails them."""

from __future__ import annotations

import os
import random
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from deploy.config import TrainConfig
from deploy.errors import UserError

Status = Literal["ok", "warn", "FAIL"]
VLLM_REQUIREMENTS = Path(__file__).with_name("vllm_requirements.txt")
SHARED_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "glusterfs", "beegfs",
                      "virtiofs", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "fuse.cephfs", "fuse.glusterfs")
PORTS_NEEDED = 2
"""Free TCP ports the run binds in the rendezvous range: the learner ranks' store and the weight-sync store."""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def line(self) -> str:
        tail = f" -> {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<4} {self.name}: {self.detail}{tail}"


@dataclass(frozen=True)
class Node:
    name: str
    gpus: float


@dataclass(frozen=True)
class GpuDemand:
    total: float
    largest_actor: float

    @property
    def wants_gpus(self) -> bool:
        return self.total > 0


def gpu_demand(cfg: TrainConfig) -> GpuDemand:
    """GPUs the config's actors reserve: engines, learner ranks and (on cuda) the skill bank's embedder."""
    r = cfg.ray
    bank = cfg.uniskill.bank
    bank_gpus = bank.embedding_gpus if cfg.uniskill.enabled and bank.embedding_device == "cuda" else 0.0
    total = cfg.rollout.initial_workers * r.rollout_gpus + r.num_learners * r.learner_gpus + bank_gpus
    return GpuDemand(total=total, largest_actor=max(r.rollout_gpus, r.learner_gpus, bank_gpus))


def recorded_stack(path: Path = VLLM_REQUIREMENTS) -> tuple[str, str]:
    """(torch version, torch.version.cuda) that vLLM 0.32's CUDA wheel was built for."""
    text = path.read_text()
    torch = re.search(r"^torch==(\S+)$", text, re.MULTILINE)
    cuda = re.search(r"^# torch\.version\.cuda: (\S+)$", text, re.MULTILINE)
    if torch is None or cuda is None:
        raise ValueError(f"{path} names no torch==<version> and no '# torch.version.cuda: <version>' line")
    return torch.group(1), cuda.group(1)


# ---- pure checks ----

def check_gpus(demand: GpuDemand, nodes: Sequence[Node]) -> Check:
    have = sum(n.gpus for n in nodes)
    per_node = ", ".join(f"{n.name} {n.gpus:g}" for n in nodes) or "no node"
    detail = f"{have:g} visible ({per_node}), the config reserves {demand.total:g}"
    fix = ("run on GPU nodes (nvidia.com/gpu in the pod spec, the NVIDIA container runtime), or lower "
           "rollout.num_workers x ray.rollout_gpus + ray.num_learners x ray.learner_gpus")
    if have + 1e-9 < demand.total:
        return Check("GPUs", "FAIL", detail, fix)
    if not any(n.gpus + 1e-9 >= demand.largest_actor for n in nodes):
        return Check("GPUs", "FAIL", f"{detail}, but no node has the {demand.largest_actor:g} one actor needs", fix)
    return Check("GPUs", "ok", detail)


def check_cuda_build(torch_version: str, torch_cuda: str | None, want_torch: str, want_cuda: str) -> Check:
    detail = f"torch {torch_version} (CUDA {torch_cuda or 'none'}), vLLM 0.32 wants torch {want_torch} on CUDA {want_cuda}"
    fix = "use the image of deploy/Dockerfile, which installs torch and vLLM from one index in one command"
    if torch_version.split("+")[0] != want_torch or torch_cuda is None:
        return Check("torch CUDA build", "FAIL", detail, fix)
    if torch_cuda.split(".")[:2] != want_cuda.split(".")[:2]:
        return Check("torch CUDA build", "FAIL", detail, fix)
    return Check("torch CUDA build", "ok", detail)


def check_nccl(available: bool, version: str | None) -> Check:
    if not available:
        return Check("NCCL", "FAIL", "torch.distributed has no NCCL backend",
                     "use a CUDA build of torch (the image of deploy/Dockerfile)")
    return Check("NCCL", "ok", f"NCCL {version}")


def check_nccl_cumem(learner: str | None, engine: str | None) -> Check:
    detail = f"NCCL_CUMEM_ENABLE is {learner or 'unset'} for the learner, {engine or 'unset'} for the engines"
    if learner != engine:
        return Check("NCCL_CUMEM_ENABLE", "FAIL", detail,
                     "set it to one value for every actor (env_vars in deploy/runtime_env.yaml): NCCL ranks "
                     "that disagree on it cannot share the weight-sync group")
    return Check("NCCL_CUMEM_ENABLE", "ok", detail)


def check_model(path: str, error: str | None) -> Check:
    if error is not None:
        return Check("model", "FAIL", error)
    return Check("model", "ok", f"{path} (on this node; every node must read the same directory or HF cache)")


def check_data_path(path: str, exists: bool) -> Check:
    if not exists:
        return Check("data", "FAIL", f"env.data_path {path} does not exist",
                     "download the data there on shared storage, or --set env.data_path=<directory>")
    return Check("data", "ok", f"env.data_path {path}")


def critic_address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


def check_critic(base_url: str, error: str | None, *, required: bool = True) -> Check:
    """`required` False (uniskill.bank.llm.allow_unavailable): the run starts anyway, its proposals rejected."""
    if error is not None:
        return Check("critic endpoint", "FAIL" if required else "warn", f"uniskill.bank.llm.base_url {base_url}: {error}",
                     "start the critic server, or --set uniskill.bank.llm.base_url=<reachable endpoint>")
    return Check("critic endpoint", "ok", f"{base_url} accepts connections")


def check_shared_storage(output_dir: str, filesystem: str, nodes: int) -> Check:
    shared = filesystem in SHARED_FILESYSTEMS
    detail = f"run.output_dir {output_dir} is on {filesystem} ({'shared' if shared else 'local'}), {nodes} node(s)"
    if nodes > 1 and not shared:
        return Check("shared storage", "warn", detail,
                     "put run.output_dir on storage every node mounts (NFS, a PVC), or checkpoints and "
                     "exports written on one node are missing on the others")
    return Check("shared storage", "ok", detail)


def check_ports(free: int, sampled: int, needed: int, port_range: tuple[int, int]) -> Check:
    detail = (f"{free} of {sampled} sampled ports free in {port_range[0]}-{port_range[1] - 1} "
              f"(the learner and weight-sync stores need {needed})")
    if free < needed:
        return Check("free ports", "FAIL", detail, "stop what holds the rendezvous range, or run on another node")
    return Check("free ports", "ok", detail)


# ---- facts ----

def _ray_address(cfg: TrainConfig) -> str | None:
    return cfg.ray.address or os.environ.get("RAY_ADDRESS") or None


def visible_nodes(cfg: TrainConfig) -> list[Node]:
    """GPUs per alive node of the cluster the run will join, or of this machine for a local run."""
    address = _ray_address(cfg)
    if address is None:
        import torch

        return [Node(socket.gethostname(), float(torch.cuda.device_count()))]
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return [Node(n["NodeManagerAddress"], n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()


def _model_error(path: str) -> str | None:
    from deploy.config_loading import resolve_model_path

    try:
        resolve_model_path(path)
    except UserError as err:
        return str(err)
    return None


def _connect_error(base_url: str, timeout_s: float = 3.0) -> str | None:
    host, port = critic_address(base_url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as err:
        return f"no connection to {host}:{port} ({err.strerror or err})"


def filesystem_of(path: str, mounts_text: str) -> str:
    """Type of the filesystem holding `path` (its nearest existing ancestor), from /proc/mounts text."""
    target = Path(path).expanduser().absolute()
    best, fstype = "", "unknown"
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(target) == point or str(target).startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, fstype = point, fields[2]
    return fstype


def _mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:
        return ""


PORT_SAMPLES = 20


def free_ports(port_range: tuple[int, int], tries: int = PORT_SAMPLES) -> int:
    free = 0
    for port in random.sample(range(*port_range), tries):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            free += 1
    return free


def _gpu_checks(cfg: TrainConfig, demand: GpuDemand, nodes: list[Node]) -> list[Check]:
    import torch
    import torch.distributed as dist

    from deploy.topology import WORKER_ENV

    want_torch, want_cuda = recorded_stack()
    nccl = dist.is_available() and dist.is_nccl_available()
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl and torch.cuda.is_available() else None
    cumem = {**os.environ, **WORKER_ENV}.get("NCCL_CUMEM_ENABLE")  # learner and engine actors: same env
    return [check_gpus(demand, nodes), check_cuda_build(torch.__version__, torch.version.cuda, want_torch, want_cuda),
            check_nccl(nccl, version), check_nccl_cumem(cumem, cumem)]


def preflight(cfg: TrainConfig, *, nodes: Callable[[TrainConfig], list[Node]] = visible_nodes) -> list[Check]:
    """The checks that apply to `cfg`, in checklist order."""
    from deploy.topology import TCP_PORTS

    demand = gpu_demand(cfg)
    found = nodes(cfg) if demand.wants_gpus or _ray_address(cfg) else [Node(socket.gethostname(), 0.0)]
    checks = _gpu_checks(cfg, demand, found) if demand.wants_gpus else []
    checks.append(check_model(cfg.model.path, _model_error(cfg.model.path)))
    if cfg.env.data_path is not None:
        checks.append(check_data_path(cfg.env.data_path, Path(cfg.env.data_path).expanduser().exists()))
    if cfg.uniskill.enabled and cfg.uniskill.bank.critic == "llm":
        llm = cfg.uniskill.bank.llm
        checks.append(check_critic(llm.base_url, _connect_error(llm.base_url), required=not llm.allow_unavailable))
    checks.append(check_shared_storage(cfg.run.output_dir, filesystem_of(cfg.run.output_dir, _mounts()), len(found)))
    checks.append(check_ports(free_ports(TCP_PORTS), PORT_SAMPLES, PORTS_NEEDED, TCP_PORTS))
    return checks
