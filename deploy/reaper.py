"""Nothing outlives a driver that started its own local Ray cluster, even a SIGKILLed one.

Ray ties its head processes (GCS, raylet, ...) to the driver that started them, and workers
notice their raylet's death within seconds, but its dashboard and runtime-env agents linger for
minutes, and what an actor starts itself (a skill bank's Redis server, an engine's subprocess)
is nobody's child once its actor is gone. So before `ray.init` starts a local cluster the driver
starts this file as a separate process (its own session, so a signal to the driver's process
group spares it) whose stdin is a pipe from the driver: the pipe closes when the driver exits,
however it exits. Meanwhile the reaper keeps a list of the driver's descendants (every
`SNAPSHOT_S`), and the driver marks its environment with a token that every process of the
cluster inherits (a process that rewrites its title may lose it from /proc, hence both). When the
pipe closes, every listed or marked process still running is terminated (SIGTERM, then SIGKILL)
and the learner rendezvous files named after the token are deleted.

Stdlib only: it runs as a script (`python deploy/reaper.py TOKEN`), never imports the project.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TOKEN_VAR = "AGENTRL_DRIVER_TOKEN"
RENDEZVOUS_PREFIX = "agentrl-rendezvous-"
"""Learner rendezvous files (`deploy.topology`) are named PREFIX + token + "-" + id."""
GRACE_S = 3.0
"""Between SIGTERM and SIGKILL."""
SNAPSHOT_S = 1.0
"""How often the list of the driver's descendants is refreshed."""

_reaper: subprocess.Popen | None = None  # held for the driver's lifetime: its stdin is the pipe


def start_reaper() -> str | None:
    """Mark this process's environment (inherited by everything Ray starts from here on) and start
    the reaper. Once per process; Linux only (it reads /proc). Returns the token."""
    global _reaper
    if _reaper is not None or not sys.platform.startswith("linux"):
        return os.environ.get(TOKEN_VAR)
    token = uuid.uuid4().hex
    os.environ[TOKEN_VAR] = token
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    _reaper = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), token], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    return token


def marked(token: str, *, proc: Path = Path("/proc")) -> list[int]:
    """Pids whose environment carries the token (processes of other users are unreadable: skipped)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _stat(pid: int, proc: Path = Path("/proc")) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of `pid`, None when it is gone."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int, *, proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> start time of every living descendant of `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name), proc)) is not None:
            children.setdefault(st[0], []).append((int(entry.name), st[1]))
    out, todo = {}, [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            if pid not in out and pid != os.getpid():
                out[pid] = started
                todo.append(pid)
    return out


def reap(token: str, known: dict[int, int] | None = None, *, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every marked or `known` (pid -> start time, checked against pid reuse) process,
    SIGKILL those left after `grace_s`; returns the pids signalled."""
    pids = set(marked(token))
    pids |= {pid for pid, started in (known or {}).items() if (st := _stat(pid)) is not None and st[1] == started}
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    return sorted(pids)


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] != "Z"


def main(token: str) -> None:
    driver = os.getppid()
    known: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], SNAPSHOT_S)
        if ready and not os.read(sys.stdin.fileno(), 1 << 16):  # b"": the driver (the only writer) is gone
            break
        if _alive(driver):
            known = {**{p: t for p, t in known.items() if _alive(p)}, **descendants(driver)}
    reap(token, known)
    for leftover in Path(tempfile.gettempdir()).glob(f"{RENDEZVOUS_PREFIX}{token}-*"):
        leftover.unlink(missing_ok=True)


if __name__ == "__main__":  # pragma: no cover - the driver starts this file as a process
    main(sys.argv[1])
