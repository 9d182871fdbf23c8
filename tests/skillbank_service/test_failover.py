"""The skill bank across server failures, on a real server: a private server SIGKILLed before or
after an apply's EXEC is restarted from its AOF and the batch is committed exactly once; `apply`
is idempotent by candidate id; a restarted owner takes the same bank over (same directory and
password, the old server ended); a configured server is waited for, then given up on; concurrent
writers lose nothing and duplicate nothing when the server dies under them."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from skillbank_service.config import SkillBankConfig
from skillbank_service.recovery import StoreUnavailableError
from skillbank_service.server import LocalRedisServer
from skillbank_service.service import BankLostError, SkillBankService
from skillbank_service.store import SkillStore

pytestmark = pytest.mark.redis


def local_bank(tmp_path, **kw) -> SkillBankService:
    cfg = SkillBankConfig(data_dir=str(tmp_path / "bank"), key_prefix="run1", embedding_model="hashing")
    return SkillBankService(cfg, **kw)


def assert_no_gap_no_duplicate(bank: SkillBankService, commits: int) -> None:
    """Each decision once, each accepted decision with exactly one history entry, one version per
    commit that wrote."""
    decisions, history = bank.decisions(), bank.history()
    cids = [d.candidate_id for d in decisions]
    assert len(cids) == len(set(cids)), "a proposal was decided twice"
    accepted = sorted(d.candidate_id for d in decisions if d.outcome == "accepted")
    assert sorted(h.candidate_id for h in history) == accepted, "history and accepted decisions disagree"
    assert bank.version() == commits
    for s in bank.snapshot().skills:
        revs = [h.revision for h in bank.history(s.skill_id)]
        assert revs == list(range(1, s.revision + 1))


def test_server_killed_before_exec_is_restarted_and_the_batch_commits_once(tmp_path, proposal, monkeypatch):
    bank = local_bank(tmp_path)
    bank.apply([proposal()])
    old_pid = bank._server.pid
    real = SkillStore._queue_writes
    crashed = []

    def crash_then_queue(self, pipe, *args):
        if not crashed:  # the server dies after planning, before EXEC reaches it
            crashed.append(bank.kill_local_server())
        return real(self, pipe, *args)

    monkeypatch.setattr(SkillStore, "_queue_writes", crash_then_queue)
    batch = [proposal(r_align=0.3), proposal(op="no_edit", text=""), proposal(r_align=0.2)]
    res = bank.apply(batch)
    assert crashed == [old_pid] and bank._server.pid != old_pid and bank.server_restarts() == 1
    assert [d.outcome for d in res.decisions] == ["accepted", "rejected", "accepted"]
    assert res.replayed == 0 and res.num_added == 2 and res.bank_version == 2
    assert len(bank.snapshot().skills) == 3
    assert_no_gap_no_duplicate(bank, commits=2)
    bank.shutdown()


def test_server_killed_after_exec_committed_replays_the_recorded_decisions(tmp_path, proposal, monkeypatch):
    """EXEC committed (and reached the AOF) but the reply was lost with the server: the repeated
    apply finds every candidate decided and writes nothing again."""
    bank = local_bank(tmp_path)
    bank.apply([proposal()])
    real = redis.client.Pipeline.execute
    crashed = []

    def commit_then_die(self, *args, **kw):
        is_apply = any(a[0] == "RPUSH" and str(a[1]).endswith(":decisions") for a, _ in self.command_stack)
        out = real(self, *args, **kw)
        if is_apply and not crashed:
            crashed.append(bank.kill_local_server())
            raise redis.ConnectionError("Connection closed by server.")
        return out

    monkeypatch.setattr(redis.client.Pipeline, "execute", commit_then_die)
    batch = [proposal(r_align=0.3), proposal(op="no_edit", text="")]
    res = bank.apply(batch)
    assert crashed and bank.server_restarts() == 1
    assert res.replayed == 2 and res.num_added == 1 and res.bank_version == 2
    assert [d.outcome for d in res.decisions] == ["accepted", "rejected"]
    assert list(res.decisions) == bank.decisions()[-2:]  # exactly what was recorded before the crash
    assert_no_gap_no_duplicate(bank, commits=2)
    bank.shutdown()


def test_reapply_by_candidate_id_returns_the_recorded_decision(redis_server, proposal):
    bank = SkillBankService(SkillBankConfig(url=redis_server.url, key_prefix="idem", embedding_model="hashing"))
    seeded = bank.apply([proposal(text="Open a closed receptacle before looking for the object inside it.")])
    sid = seeded.decisions[0].skill_id
    batch = [proposal(r_align=0.4), proposal(r_align=-0.1),
             proposal(op="update", target_skill_id=sid, text="Open every closed receptacle before searching it.")]
    first = bank.apply(batch)
    before = (bank.snapshot(), bank.history(), bank.decisions(), bank.stats())
    again = bank.apply(batch)
    assert again.decisions == first.decisions and again.replayed == 3 and again.attempts == 1
    assert (again.num_added, again.num_updated) == (first.num_added, first.num_updated) == (1, 1)
    assert (bank.snapshot(), bank.history(), bank.decisions(), bank.stats()) == before
    # the same candidate with other content still gets its recorded decision, not a new one
    twin = proposal(candidate_id=batch[0].candidate_id, text=batch[0].text)  # now a duplicate of the bank
    fresh = proposal(r_align=0.5)
    mixed = bank.apply([twin, fresh])
    assert mixed.decisions[0] == first.decisions[0] and mixed.decisions[0].outcome == "accepted"
    assert mixed.decisions[1].outcome == "accepted" and mixed.replayed == 1 and mixed.num_added == 2
    assert bank.version() == 3
    named = {"candidate_id": "m1", "step": 9, "op": "add"}  # malformed inputs with an id are keyed too
    assert bank.apply([named]).replayed == 0 and bank.apply([named]).replayed == 1
    assert_no_gap_no_duplicate(bank, commits=3)


def test_a_restarted_owner_takes_the_same_bank_over(tmp_path, proposal):
    """The owner dies without shutting its server down (an actor killed where the death signal
    could not be armed): the next owner ends that server and restarts on the same AOF and password."""
    first = local_bank(tmp_path)
    first.apply([proposal(), proposal(r_align=0.3)])
    old_server, before = first._server, (first.snapshot(), first.history(), first.decisions())
    password_file = tmp_path / "bank" / "password"
    assert password_file.stat().st_mode & 0o777 == 0o600
    assert password_file.read_text().strip() == old_server.password
    second = local_bank(tmp_path, expect_existing=True)
    try:
        assert not old_server.is_running()  # ended before the new one opened the AOF
        assert second._server.password == old_server.password
        assert (second.snapshot(), second.history(), second.decisions()) == before
        assert second.apply([proposal()]).bank_version == 2
    finally:
        second.shutdown()
    assert (tmp_path / "bank").is_dir()  # a configured data_dir is kept


def test_a_restarted_owner_refuses_an_empty_data_dir(tmp_path):
    with pytest.raises(BankLostError, match="shared storage"):
        local_bank(tmp_path, expect_existing=True)


def test_a_configured_server_is_waited_for_then_given_up_on(tmp_path, proposal):
    server = LocalRedisServer(tmp_path / "ext").start()
    try:
        cfg = SkillBankConfig(url=server.url, key_prefix="ext", embedding_model="hashing", reconnect_timeout_s=30)
        bank = SkillBankService(cfg)
        bank.apply([proposal()])
        server.crash()
        back = threading.Timer(1.5, server.start)  # an operator restarts it on the same port
        back.start()
        res = bank.apply([proposal()])  # waits for the server, then commits
        back.join()
        assert res.bank_version == 2 and res.decisions[0].outcome == "accepted"
        assert_no_gap_no_duplicate(bank, commits=2)
        impatient = SkillBankService(cfg.model_copy(update={"reconnect_timeout_s": 1.0}))
        server.crash()
        with pytest.raises(StoreUnavailableError, match="reconnect_timeout_s"):
            impatient.version()
    finally:
        server.stop()


def test_concurrent_writers_lose_nothing_when_the_server_dies_under_them(tmp_path, proposal):
    bank = local_bank(tmp_path)
    batches = [[proposal(r_align=0.1 + 0.01 * i), proposal(r_align=0.2 + 0.01 * i)] for i in range(16)]
    started = threading.Event()

    def writer(mine):
        for b in mine:
            started.set()
            assert all(d.outcome == "accepted" for d in bank.apply(b).decisions)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(writer, batches[w::4]) for w in range(4)]
        started.wait(timeout=30)
        bank.kill_local_server()
        for f in futures:
            f.result(timeout=120)  # a writer's failure is raised here
    assert bank.server_restarts() >= 1
    assert len(bank.snapshot().skills) == 32 and len(bank.decisions()) == 32
    assert_no_gap_no_duplicate(bank, commits=16)
    bank.shutdown()
