"""Security defaults of a local run, checked on a real one (UniSkill smoke on local Ray: engines,
learner, env pools, the skill-bank actor and its private valkey/redis server): every listening
socket is on loopback (the Ray dashboard is off), the local Redis requires its random password
from a 0600 config file, and no secret reaches the files a run writes.

The run is the 2-step UniSkill run test_uniskill_smoke inspects live (`shared_runs_a`), scanned for
listening sockets from start to end; it uses the HF engine because this test is about the run's
sockets and files, not the engine."""

from __future__ import annotations

import ipaddress

import pytest

from tests.deploy.shared_runs import CRITIC_KEY, uniskill_live_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return (mapped or addr).is_loopback


def test_loopback_rule():
    assert all(map(_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.53"]))
    assert not any(map(_loopback, ["0.0.0.0", "::", "10.1.2.3", "::ffff:10.1.2.3"]))


def test_local_run_listens_on_loopback_only_and_writes_no_secret(warm_model, tmp_path_factory):
    live = uniskill_live_run(tmp_path_factory, warm_model)  # shared with test_uniskill_smoke
    assert live.returncode == 0, live.log[-4000:]
    run, seen = live.path, live.listening
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
    leaks += [f"console: {what}" for what, secret in (("redis password", password), ("critic key", CRITIC_KEY))
              if secret in live.log]
    assert leaks == [], leaks
    assert (run / "metrics.jsonl").is_file() and (run / "config.resolved.json").is_file()
    assert any((run / "logs").glob("*.log")) and any((run / "trajectories").glob("*.jsonl"))
