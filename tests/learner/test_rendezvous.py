"""The learner ranks' process group on one node: a FileStore rendezvous and loopback collectives,
so no socket of the group listens beyond loopback (a TCPStore would listen on every interface)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RANK = textwrap.dedent("""
    import os, sys, psutil, torch, torch.distributed as dist
    from learner.backends import init_process_group_on_node
    rank, path = int(sys.argv[1]), sys.argv[2]
    init_process_group_on_node(path, rank=rank, world_size=2, backend="gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN})
    print(t.item(), ",".join(listening), flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_two_ranks_meet_through_a_file_and_listen_on_loopback_only(tmp_path):
    store = tmp_path / "rendezvous"
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("SOCKET_IFNAME")}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(store)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).resolve().parents[2])
             for rank in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    for out, _ in outs:
        total, addrs = out.split()
        assert float(total) == 3.0
        assert set(addrs.split(",")) <= {"127.0.0.1", "::1"}, addrs
