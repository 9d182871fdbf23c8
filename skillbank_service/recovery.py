"""Keeping the skill bank's store usable across a server failure (plain logic: the store, the
server restart and the error test are injected, so it imports neither redis nor a server).

`Recovering.call(op)` runs `op(store)`; when it fails with an error `is_transient` accepts (a lost
connection, a server restarting or loading its AOF), it recovers and runs `op` again, until
`timeout_s` have passed since the call's first failure (then `StoreUnavailableError`):
- a private server that is no longer running (`needs_restart`) is restarted on its data
  directory (`restart`: the AOF brings back every acknowledged write) and a fresh store is
  connected to it;
- otherwise (a configured URL, a server still loading) it waits with exponential backoff and
  connects again.
The skill-bank actor is threaded, so several calls may fail at once: one thread recovers while the
others wait on the lock, then see the new generation and retry. Repeating `op` is safe because
reads only read and `apply` is idempotent by candidate id (store.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

log = logging.getLogger(__name__)


class StoreUnavailableError(RuntimeError):
    """The bank's server stayed unreachable for the whole recovery timeout."""


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.1
    cap_s: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt `attempt` (0-based): doubling, capped."""
        return min(self.cap_s, self.first_s * 2 ** min(attempt, 30))


class Recovering(Generic[S]):
    """A store that reconnects (and restarts its own server) when a call finds the server gone."""

    def __init__(self, connect: Callable[[], S], *, is_transient: Callable[[BaseException], bool],
                 timeout_s: float, restart: Callable[[], None] | None = None,
                 needs_restart: Callable[[], bool] = lambda: False, backoff: Backoff = Backoff(),
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self._connect, self._is_transient, self._timeout_s = connect, is_transient, timeout_s
        self._restart, self._needs_restart = restart, needs_restart
        self._backoff, self._sleep, self._clock = backoff, sleep, clock
        self._lock = threading.Lock()
        self._store = connect()
        self._generation = 0
        self.restarts = 0
        """Server restarts performed."""
        self.reconnects = 0
        """Successful reconnections (after a restart or a wait)."""

    @property
    def store(self) -> S:
        return self._store

    def call(self, op: Callable[[S], T]) -> T:
        deadline: float | None = None
        attempt = 0
        while True:
            with self._lock:
                store, generation = self._store, self._generation
            try:
                return op(store)
            except Exception as err:
                if not self._is_transient(err):
                    raise
                now = self._clock()
                deadline = now + self._timeout_s if deadline is None else deadline
                if now >= deadline:
                    raise StoreUnavailableError(f"the skill bank's server stayed unreachable for "
                                                f"{self._timeout_s:.0f}s (skillbank.reconnect_timeout_s): "
                                                f"{err}") from err
                self._recover(generation, err, attempt)
                attempt += 1

    def _recover(self, generation: int, err: BaseException, attempt: int) -> None:
        with self._lock:
            if self._generation != generation:
                return  # another thread recovered meanwhile
            if self._restart is not None and self._needs_restart():
                log.warning("skill bank: its server is not running (%s); restarting it from its data directory", err)
                self._restart()
                self.restarts += 1
            else:
                delay = self._backoff.delay(attempt)
                log.warning("skill bank: server unreachable (%s); reconnecting in %.1fs", err, delay)
                self._sleep(delay)
            try:
                store = self._connect()
            except Exception as again:
                if not self._is_transient(again):
                    raise
                return  # still down: the caller tries again until its deadline
            self._store, self._generation = store, self._generation + 1
            self.reconnects += 1
            log.warning("skill bank: reconnected to its server")
