"""`recovery.Recovering` with fakes: what it restarts, how long it waits, when it gives up, and that
many failing threads cause one recovery."""

import threading

import pytest

from skillbank_service.recovery import Backoff, Recovering, StoreUnavailableError


class Down(Exception):
    pass


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


class World:
    """A server that is up or down; `connect` hands out numbered stores."""

    def __init__(self):
        self.up, self.running, self.connects, self.restarts = True, True, 0, 0

    def connect(self) -> int:
        if not self.up:
            raise Down("connect refused")
        self.connects += 1
        return self.connects

    def restart(self) -> None:
        self.restarts += 1
        self.running = self.up = True


def make(world: World, clock: FakeClock, *, local: bool, timeout_s: float = 10.0) -> Recovering:
    return Recovering(world.connect, is_transient=lambda e: isinstance(e, Down), timeout_s=timeout_s,
                      restart=world.restart if local else None, needs_restart=lambda: not world.running,
                      backoff=Backoff(first_s=0.5, cap_s=2.0), sleep=clock.sleep, clock=clock)


def test_backoff_doubles_up_to_its_cap():
    assert [Backoff(first_s=0.1, cap_s=1.0).delay(i) for i in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_dead_private_server_is_restarted_once_and_the_call_repeated():
    world, clock = World(), FakeClock()
    rec = make(world, clock, local=True)
    seen = []

    def op(store):
        seen.append(store)
        if store == 1:  # the first store's server died
            world.running = world.up = False
            raise Down("connection reset")
        return "ok"

    assert rec.call(op) == "ok"
    assert seen == [1, 2] and world.restarts == 1 and rec.restarts == 1 and rec.reconnects == 1
    assert clock.sleeps == []  # a restart needs no waiting


def test_a_configured_server_is_waited_for_with_backoff():
    world, clock = World(), FakeClock()
    rec = make(world, clock, local=False)
    world.up = False
    def op(store):
        if store == 1:  # the old connection stays broken
            raise Down("connection reset")
        return store

    original = clock.sleep

    def sleep(s):  # the server comes back after the third wait
        original(s)
        world.up = len(clock.sleeps) >= 3

    rec._sleep = sleep
    assert rec.call(op) == 2
    assert clock.sleeps == [0.5, 1.0, 2.0] and world.restarts == 0 and rec.reconnects == 1


def test_gives_up_after_the_timeout_and_passes_other_errors_through():
    world, clock = World(), FakeClock()
    rec = make(world, clock, local=False, timeout_s=5.0)
    world.up = False

    def down(store):
        raise Down("connection refused")

    with pytest.raises(StoreUnavailableError, match="reconnect_timeout_s"):
        rec.call(down)
    assert 5.0 <= clock.now <= 7.0

    def broken(store):
        raise ValueError("not a connection problem")

    with pytest.raises(ValueError):
        rec.call(broken)


def test_many_failing_threads_cause_one_restart():
    world, clock = World(), FakeClock()
    rec = make(world, clock, local=True)
    world.running = world.up = False
    barrier = threading.Barrier(6)
    results = []

    def op(store):
        if store == 1:
            barrier.wait(timeout=10)  # every thread fails on the dead server's store
            raise Down("connection reset")
        return store

    threads = [threading.Thread(target=lambda: results.append(rec.call(op))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == [2] * 6 and world.restarts == 1
