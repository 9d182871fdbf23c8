"""One extra process group between learner rank 0 (the sender, rank 0) and every rollout engine
worker (ranks 1..N), built WITHOUT `torch.distributed.init_process_group`: each member constructs
a c10d backend object (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPU) on its own store and calls
its collectives directly. No process's default group is created, read or changed, so DeepSpeed's
group (learner ranks) and vLLM's (tensor-parallel ranks) stay untouched, and this group never
depends on how the default group was initialised (docs/architecture.md "Weight sync" on the
`device_id` hang).

Rendezvous: a FileStore when every member runs on one node (nothing listens on the network), a
TCPStore hosted by rank 0 otherwise. Every wait is bounded by `timeout_s`; a failed collective
raises `WeightSyncError` naming the group's other members instead of hanging.

Failure semantics (docs/gpu.md "When a weight sync fails"): a failure raises in the calling thread
and never takes the process down; the group is then discarded with `abort()` (never `shutdown()`,
which waits for the collective that will not finish) and a new one is built for the next sync.
On NCCL that takes two settings of this group only (`nccl_settings`): ProcessGroupNCCL reads
`TORCH_NCCL_ASYNC_ERROR_HANDLING` in its constructor, and its default 3 (SkipCleanUp) makes the
watchdog kill the process when a collective times out, so the group is constructed with 2
(CleanUpOnly: abort the communicators, raise, keep the process); and the watchdog's timeout (the
group's options) is longer than the per-bucket wait, so `Work.wait(timeout_s)` raises first, in
this thread. NCCL connects lazily at the first collective: joining ends with one tiny broadcast
(on gloo too), so a member that cannot connect fails the join, not the first bucket.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


class WeightSyncError(RuntimeError):
    """A weight-sync collective failed or timed out (a member died or stopped answering)."""


@dataclass(frozen=True)
class GroupSpec:
    """Everything a member needs to join; the driver builds it and hands it to every member."""

    name: str
    """Unique per group incarnation (store key prefix; a rebuilt group gets a new name)."""
    members: tuple[str, ...]
    """Human-readable name of each rank, rank 0 (the sender) first: used in error messages."""
    timeout_s: float
    """Bound on the rendezvous and on every collective."""
    store_file: str | None = None
    """FileStore path (all members on one node); None: TCPStore at host:port."""
    host: str = "127.0.0.1"
    """Rank 0's address: the TCPStore's host, and the interface the members route from."""
    port: int = 0
    """TCPStore port: rank 0 binds it. Drawn free on rank 0's node outside Ray's and the kernel's
    ephemeral ranges, as the learner rendezvous draws its port (`deploy.topology.free_tcp_port`)."""
    backend: str = "auto"
    """"gloo", "nccl", or "auto" (nccl when CUDA is available, else gloo)."""

    @property
    def world_size(self) -> int:
        return len(self.members)

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if torch.cuda.is_available() else "gloo"


def _timeout(spec: GroupSpec) -> datetime.timedelta:
    return datetime.timedelta(seconds=spec.timeout_s)


NCCL_ERROR_HANDLING_VAR = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_CLEANUP_ONLY = "2"
"""ProcessGroupNCCL's ErrorHandlingMode CleanUpOnly: on an error or timeout the watchdog aborts
the communicators and the exception reaches the caller; the process lives (3, the default,
SkipCleanUp, and 1, TearDown, take it down)."""
WATCHDOG_MARGIN_S = 60.0
"""The NCCL watchdog's timeout exceeds the per-bucket wait (`timeout_s`) by this much."""


@dataclass(frozen=True)
class NcclSettings:
    """What the weight-sync group's ProcessGroupNCCL is built with (pure: tested without a GPU)."""

    env: dict[str, str] = field(default_factory=dict)
    """Set only while the backend object is constructed (it reads them in its constructor)."""
    watchdog_timeout: datetime.timedelta = datetime.timedelta(0)
    """The options' `_timeout`: the watchdog's bound on a collective."""
    wait_timeout: datetime.timedelta = datetime.timedelta(0)
    """What each `Work.wait` is given: shorter, so the caller's thread raises first."""


def nccl_settings(spec: GroupSpec) -> NcclSettings:
    return NcclSettings(env={NCCL_ERROR_HANDLING_VAR: NCCL_CLEANUP_ONLY},
                        watchdog_timeout=datetime.timedelta(seconds=spec.timeout_s + WATCHDOG_MARGIN_S),
                        wait_timeout=_timeout(spec))


def nccl_options(options_cls, settings: NcclSettings):
    """`ProcessGroupNCCL.Options` (passed in: CPU builds of torch lack the class) for `settings`."""
    opts = options_cls()
    opts._timeout = settings.watchdog_timeout
    return opts


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ (visible to C++ getenv) for the block only; restored afterwards."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old


def local_address_towards(host: str) -> str:
    """The address of this machine's interface that routes to `host` (no packet is sent)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))
        return sock.getsockname()[0]


class WeightGroup:
    """This process's membership of the weight-sync group (rank 0 sends, the others receive)."""

    def __init__(self, spec: GroupSpec, rank: int, *, store=None, device: torch.device | None = None):
        import torch.distributed as dist

        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} outside the weight-sync group of {spec.world_size} members")
        self.spec, self.rank = spec, rank
        self.backend = spec.resolved_backend()
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self.device = device
        if store is None:
            if spec.store_file is not None:
                store = dist.FileStore(spec.store_file, spec.world_size)
            else:
                # rank 0 hosts the store (at the port `spec.port` its node probed free); the others connect
                store = dist.TCPStore(spec.host, spec.port, spec.world_size, rank == 0, timeout=_timeout(spec))
        store.set_timeout(_timeout(spec))
        self._store = dist.PrefixStore(f"weightsync/{spec.name}", store)
        self._pg = None
        self.failed = False
        """True once a collective failed: the group was aborted and cannot be used again."""
        try:
            self._pg = self._backend_object(dist)
            self._connect()
        except Exception as err:  # rendezvous failures become one clear error
            self.abort()
            raise WeightSyncError(f"{self._who()} could not join weight-sync group {spec.name!r} within "
                                  f"{spec.timeout_s:g}s ({type(err).__name__}: {err}); members: "
                                  f"{', '.join(spec.members)}") from err

    def _backend_object(self, dist):
        if self.backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = _timeout(self.spec)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address_towards(self.spec.host))]
            return dist.ProcessGroupGloo(self._store, self.rank, self.spec.world_size, opts)
        if self.backend == "nccl":
            settings = nccl_settings(self.spec)
            with scoped_env(settings.env):
                return dist.ProcessGroupNCCL(self._store, self.rank, self.spec.world_size,
                                             nccl_options(dist.ProcessGroupNCCL.Options, settings))
        raise ValueError(f"weight-sync backend {self.backend!r}: use gloo or nccl")

    def _connect(self) -> None:
        """Form the connections now (NCCL creates its communicator at the first collective): one
        one-element broadcast that every member must reach within timeout_s."""
        if self.backend == "nccl":
            self._pg.eager_connect_single_device(self.device)
        self._collective(torch.zeros(1, dtype=torch.uint8, device=self.device))

    def _who(self) -> str:
        return f"{self.spec.members[self.rank]} (weight-sync rank {self.rank})"

    def peers(self) -> list[str]:
        """The members this rank exchanges with: everyone for the sender, the sender otherwise."""
        if self.rank == 0:
            return list(self.spec.members[1:])
        return [self.spec.members[0]]

    def _collective(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = _timeout(self.spec)
        self._pg.broadcast([tensor], opts).wait(_timeout(self.spec))

    def broadcast(self, tensor: torch.Tensor, *, what: str) -> None:
        """Broadcast `tensor` (on `self.device`) from rank 0 in place; raises WeightSyncError naming
        the peers when a member is gone or silent for timeout_s (the group is then aborted)."""
        if self._pg is None:
            raise WeightSyncError(f"{self._who()} cannot use weight-sync group {self.spec.name!r} during {what}: "
                                  "it was discarded after a failure (the next sync builds a new one)")
        try:
            self._collective(tensor)
        except Exception as err:  # every backend failure becomes one clear error
            self.abort()
            side = "sending to" if self.rank == 0 else "receiving from"
            raise WeightSyncError(
                f"{self._who()} failed {side} {', '.join(self.peers())} during {what} "
                f"(group {self.spec.name!r}, timeout {self.spec.timeout_s:g}s): a peer died or stopped "
                f"answering ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
            ) from err

    def abort(self) -> None:
        """Abort the backend after a failure: `abort()` cancels what is in flight (ncclCommAbort
        on NCCL), where `shutdown()` would wait for a collective whose peer is gone."""
        pg, self._pg, self.failed = self._pg, None, True
        if pg is not None:
            with contextlib.suppress(Exception):  # already aborted by the watchdog, or never connected
                pg.abort()

    def close(self) -> None:
        """Release the backend's connections (the group cannot be used afterwards): shut down when
        healthy; a failed group was aborted already."""
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None:
            with contextlib.suppress(Exception):  # a peer may have gone since the last collective
                pg.shutdown()
