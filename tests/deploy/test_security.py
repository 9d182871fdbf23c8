"""Security defaults of a local run, checked on a real one (UniSkill smoke on local Ray: engines,
learner, env pools, the skill-bank actor and its private valkey/redis server): every listening
socket is on loopback (the Ray dashboard is off), the local Redis requires its random password
from a 0600 config file, and no secret reaches the files a run writes."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CRITIC_KEY = "critic-key-that-must-never-be-written-0f3a9c"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return (mapped or addr).is_loopback


def _listening(root: psutil.Process) -> dict[tuple[str, int], str]:
    """(ip, port) -> process name, for every LISTEN socket of `root` and its descendants."""
    pids = {root.pid: root.name()}
    for child in root.children(recursive=True):
        try:
            pids[child.pid] = child.name()
        except psutil.NoSuchProcess:
            continue
    out = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out[(conn.laddr.ip, conn.laddr.port)] = pids[conn.pid]
    return out


def test_loopback_rule():
    assert all(map(_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.53"]))
    assert not any(map(_loopback, ["0.0.0.0", "::", "10.1.2.3", "::ffff:10.1.2.3"]))


def test_local_run_listens_on_loopback_only_and_writes_no_secret(model, tmp_path):
    run = tmp_path / "run"
    sets = [f"model.path={model}", f"run.output_dir={run}", "run.total_steps=1", "eval.at_end=false",
            "rollout.tasks_per_step=2", "rollout.group_size=4"]  # the sockets and files matter, not the episodes
    cmd = [sys.executable, "-m", "deploy", "train", "--config", str(ROOT / "deploy/configs/smoke_cpu_uniskill.yaml"),
           *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "SKILL_CRITIC_API_KEY": CRITIC_KEY}
    seen: dict[tuple[str, int], str] = {}
    with (tmp_path / "train.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            root = psutil.Process(proc.pid)
            deadline = time.monotonic() + 900
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    seen.update(_listening(root))
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.5)
            assert proc.wait(timeout=60) == 0, (tmp_path / "train.log").read_text()[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    names = set(seen.values())
    assert any("raylet" in n or "gcs_server" in n for n in names), f"no Ray process seen listening: {seen}"
    assert any("server" in n and ("valkey" in n or "redis" in n) for n in names), f"no Redis seen: {seen}"
    exposed = {addr: name for addr, name in seen.items() if not _loopback(addr[0])}
    assert exposed == {}, f"sockets listening beyond loopback: {exposed}"
    assert 8265 not in {port for _, port in seen}, "the Ray dashboard is listening"

    # the private skill-bank server: random password in a 0600 config file, required by the server
    conf = run / "skillbank" / "server.conf"
    assert conf.stat().st_mode & 0o077 == 0
    lines = dict(line.split(" ", 1) for line in conf.read_text().splitlines() if " " in line)
    password = lines["requirepass"].strip()
    assert len(password) >= 24 and lines["bind"].strip() == "127.0.0.1"

    # no secret in anything the run wrote (the server's own config and data files aside)
    leaks = []
    for path in run.rglob("*"):
        if path.is_file() and "skillbank" not in path.relative_to(run).parts[:1]:
            data = path.read_bytes()
            leaks += [f"{path.relative_to(run)}: {what}" for what, secret in
                      (("redis password", password), ("critic key", CRITIC_KEY)) if secret.encode() in data]
    log_text = (tmp_path / "train.log").read_text()
    leaks += [f"console: {what}" for what, secret in (("redis password", password), ("critic key", CRITIC_KEY))
              if secret in log_text]
    assert leaks == [], leaks
    assert (run / "metrics.jsonl").is_file() and (run / "config.resolved.json").is_file()
    assert any((run / "logs").glob("*.log")) and any((run / "trajectories").glob("*.jsonl"))
