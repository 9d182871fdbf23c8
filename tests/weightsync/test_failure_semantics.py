"""How the weight-sync group is built so that a failure raises instead of ending the process, pinned
without a GPU: the settings ProcessGroupNCCL is constructed with (error handling for this group
only, a watchdog slower than the per-bucket wait), the eager connect at join, and `abort()` (not
`shutdown()`) on a failed group. The backend object is a stand-in here (pure unit tests); the
same control flow runs over real gloo groups in test_protocol.py and tests/deploy/test_weight_sync.py."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from weightsync.group import (
    NCCL_ERROR_HANDLING_VAR,
    GroupSpec,
    WeightGroup,
    WeightSyncError,
    nccl_options,
    nccl_settings,
    scoped_env,
)

CTX = mp.get_context("spawn")


def _spec(tmp_path, backend: str, timeout_s: float = 30.0) -> GroupSpec:
    return GroupSpec(name="unit", members=("learner_0", "rollout_worker_0"), timeout_s=timeout_s,
                     store_file=str(tmp_path / "store"), backend=backend)


class _Options:
    """Stands in for ProcessGroupNCCL.Options (absent from CPU builds of torch)."""

    _timeout = datetime.timedelta(minutes=10)


class _Work:
    def __init__(self, error: Exception | None):
        self.error = error

    def wait(self, timeout: datetime.timedelta) -> bool:
        if self.error is not None:
            raise self.error
        return True


class _Backend:
    """Records what WeightGroup does with its backend object."""

    built: ClassVar[list[_Backend]] = []
    fail_after: ClassVar[int] = 10**9

    def __init__(self, store, rank, size, opts):
        self.opts, self.env = opts, os.environ.get(NCCL_ERROR_HANDLING_VAR)
        self.calls: list[str] = []
        _Backend.built.append(self)

    Options = _Options

    def eager_connect_single_device(self, device) -> None:
        self.calls.append(f"eager_connect:{device}")

    def broadcast(self, tensors, opts) -> _Work:
        self.calls.append("broadcast")
        broken = self.calls.count("broadcast") > self.fail_after
        return _Work(RuntimeError("NCCL error: remote process exited") if broken else None)

    def abort(self) -> None:
        self.calls.append("abort")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture
def fake_nccl(monkeypatch):
    _Backend.built, _Backend.fail_after = [], 10**9
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _Backend, raising=False)
    monkeypatch.delenv(NCCL_ERROR_HANDLING_VAR, raising=False)
    return _Backend


def test_nccl_settings_raise_in_the_caller_before_the_watchdog_acts(tmp_path):
    settings = nccl_settings(_spec(tmp_path, "nccl", timeout_s=30.0))
    assert settings.env == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}  # CleanUpOnly: abort comms, keep the process
    assert settings.wait_timeout == datetime.timedelta(seconds=30)
    assert settings.watchdog_timeout == datetime.timedelta(seconds=90)
    assert nccl_options(_Options, settings)._timeout == datetime.timedelta(seconds=90)


def test_scoped_env_is_visible_inside_and_restored_after(monkeypatch):
    monkeypatch.setenv(NCCL_ERROR_HANDLING_VAR, "3")
    with scoped_env({NCCL_ERROR_HANDLING_VAR: "2"}):
        assert os.environ[NCCL_ERROR_HANDLING_VAR] == "2"
    assert os.environ[NCCL_ERROR_HANDLING_VAR] == "3"
    monkeypatch.delenv(NCCL_ERROR_HANDLING_VAR)
    with scoped_env({NCCL_ERROR_HANDLING_VAR: "2"}):
        pass
    assert NCCL_ERROR_HANDLING_VAR not in os.environ


def test_the_nccl_group_alone_is_built_with_cleanup_only_and_connects_at_join(tmp_path, fake_nccl):
    device = torch.device("cpu")
    group = WeightGroup(_spec(tmp_path, "nccl"), 0, device=device)
    [backend] = fake_nccl.built
    assert backend.env == "2" and NCCL_ERROR_HANDLING_VAR not in os.environ  # this constructor only
    assert backend.opts._timeout == datetime.timedelta(seconds=90)
    assert backend.calls == ["eager_connect:cpu", "broadcast"]  # connected and checked before join returns
    group.close()
    assert backend.calls[-1] == "shutdown"  # a healthy group shuts down


def test_a_failed_collective_aborts_the_group_and_never_shuts_it_down(tmp_path, fake_nccl):
    fake_nccl.fail_after = 2  # the join's handshake, then one bucket, then a peer is gone
    group = WeightGroup(_spec(tmp_path, "nccl"), 0, device=torch.device("cpu"))
    group.broadcast(torch.zeros(4), what="bucket 1/3")
    with pytest.raises(WeightSyncError, match=r"failed sending to rollout_worker_0 during bucket 2/3"):
        group.broadcast(torch.zeros(4), what="bucket 2/3")
    [backend] = fake_nccl.built
    assert group.failed and backend.calls[-1] == "abort"
    with pytest.raises(WeightSyncError, match="discarded after a failure"):
        group.broadcast(torch.zeros(4), what="bucket 3/3")
    group.close()
    assert "shutdown" not in backend.calls


def test_a_join_whose_handshake_fails_is_a_join_error(tmp_path, fake_nccl):
    fake_nccl.fail_after = 0
    with pytest.raises(WeightSyncError, match="could not join weight-sync group 'unit'"):
        WeightGroup(_spec(tmp_path, "nccl"), 0, device=torch.device("cpu"))
    [backend] = fake_nccl.built
    assert backend.calls == ["eager_connect:cpu", "broadcast", "abort"]


def _wait_for_bucket(spec: GroupSpec, queue) -> None:
    group = WeightGroup(spec, 1)
    start = time.monotonic()
    try:
        group.broadcast(torch.zeros(4), what="bucket 1/1")
        queue.put(("ok", time.monotonic() - start, group.failed))
    except WeightSyncError:
        queue.put(("error", time.monotonic() - start, group.failed))


def test_an_aborted_gloo_member_makes_its_peers_fail_at_once(tmp_path):
    """Real gloo: the member that failed aborts its side, and a peer waiting on it raises within
    seconds instead of waiting out the group's timeout."""
    spec = GroupSpec(name=f"a{time.monotonic_ns()}", members=("learner_0", "rollout_worker_0"), timeout_s=60.0,
                     store_file=str(tmp_path / "store"))
    queue = CTX.Queue()
    proc = CTX.Process(target=_wait_for_bucket, args=(spec, queue))
    proc.start()
    group = WeightGroup(spec, 0)  # returns once both joined (the join's handshake)
    time.sleep(1.0)
    group.abort()
    status, waited, failed = queue.get(timeout=60)
    proc.join(timeout=30)
    assert status == "error" and failed and waited < 15.0  # well under timeout_s=60
