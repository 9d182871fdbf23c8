"""`SkillBankService`: the skill bank as one plain object (deploy/ hosts it as the named Ray actor
"skillbank"). It owns a Redis connection (and a private local server when no URL is configured),
the embedding model and a retrieval index that is rebuilt whenever the bank version moves, so any
number of service instances over one server stay consistent.

Only edits that pass the acceptance rule (acceptance.py) reach the bank; every proposal passed to
`apply` gets a Decision, recorded in Redis in the same transaction as the edits it caused, and a
proposal whose candidate id already has one gets that decision back (a repeated call writes nothing).

Every store call goes through `recovery.Recovering`: when the server dies, a private server is
restarted on its data directory (same password, AOF reloaded) and the call is repeated; a
configured URL is waited for with backoff, up to `reconnect_timeout_s`. A service constructed with
`expect_existing=True` (a restarted actor) refuses to start a private server on a data directory
that never held a bank, rather than continue silently with an empty one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import ValidationError

from skillbank_service.acceptance import intrinsic_rejection, plan_acceptance
from skillbank_service.config import SkillBankConfig
from skillbank_service.recovery import Recovering
from skillbank_service.retrieval import SkillIndex, build_index, make_embedder
from skillbank_service.server import LocalRedisServer, has_persisted_state
from skillbank_service.store import SkillStore, connect, is_unavailable
from skillbank_service.types import (
    ApplyResult,
    BankSnapshot,
    BankStats,
    Decision,
    HistoryEntry,
    RetrievedSkill,
    ScoredProposal,
    Skill,
)

T = TypeVar("T")


class BankLostError(RuntimeError):
    """A restarted bank found no earlier server state in its data directory."""


class SkillBankService:
    def __init__(self, cfg: SkillBankConfig, *, expect_existing: bool = False, temporary_data: bool = False):
        """`temporary_data`: the private server's data_dir is removed by `shutdown` (as when
        cfg.data_dir is None)."""
        self.cfg = cfg
        self._server: LocalRedisServer | None = None
        if cfg.url is None:
            if expect_existing and (cfg.data_dir is None or not has_persisted_state(cfg.data_dir)):
                raise BankLostError(f"the skill bank restarted but its data directory {cfg.data_dir} holds no "
                                    "bank (was the actor restarted on another node? keep run.output_dir on "
                                    "shared storage, or configure uniskill.bank.url)")
            self._server = LocalRedisServer(cfg.data_dir, temporary=temporary_data or cfg.data_dir is None).start()
        self._link = Recovering(self._open_store, is_transient=is_unavailable, timeout_s=cfg.reconnect_timeout_s,
                                restart=self._restart_server if self._server is not None else None,
                                needs_restart=self._server_died)
        self._closed = False
        self._embed = make_embedder(cfg.embedding_model, cfg.embedding_device)
        self._index: SkillIndex | None = None

    def _open_store(self) -> SkillStore:
        if self._server is not None:
            client = connect(self.cfg.model_copy(update={"tls": False}), self._server.url)
        else:
            client = connect(self.cfg)
        return SkillStore(client, self.cfg.key_prefix, max_write_attempts=self.cfg.max_write_attempts)

    def _server_died(self) -> bool:
        return self._server is not None and not self._server.is_running()

    def _restart_server(self) -> None:
        assert self._server is not None
        self._server.restart()

    def _call(self, op: Callable[[SkillStore], T]) -> T:
        if self._closed:
            raise RuntimeError("the skill bank was shut down")
        return self._link.call(op)

    # ------------------------------------------------------------ inspection

    def ping(self) -> bool:
        return self._call(lambda s: s.ping())

    def version(self) -> int:
        return self._call(lambda s: s.version())

    def snapshot(self) -> BankSnapshot:
        return self._call(lambda s: s.snapshot())

    def get(self, skill_id: str) -> Skill | None:
        return self._call(lambda s: s.get(skill_id))

    def history(self, skill_id: str | None = None) -> list[HistoryEntry]:
        """Every applied edit of one skill (or of the whole bank), oldest first."""
        return self._call(lambda s: s.history(skill_id))

    def decisions(self, last: int | None = None) -> list[Decision]:
        """The decisions log, oldest first (the last `last` entries when given)."""
        return self._call(lambda s: s.decisions(last))

    def stats(self) -> BankStats:
        return self._call(lambda s: s.stats())

    def server_restarts(self) -> int:
        """How often this incarnation restarted its private server after finding it dead."""
        return self._link.restarts

    def kill_local_server(self) -> int:
        """Fault injection: SIGKILL the private server (no shutdown, no notice); the next call finds
        it dead and restarts it. Returns the killed pid. A configured URL has no server to kill."""
        if self._server is None or self._server.pid is None:
            raise ValueError("the skill bank uses a configured server (skillbank.url): it has no private "
                             "server to kill")
        pid = self._server.pid
        self._server.crash()
        return pid

    # ------------------------------------------------------------ retrieval

    def _current_index(self) -> SkillIndex:
        if self._index is None or self._index.version != self.version():
            self._index = build_index(*self._call(lambda s: s.embeddings()))
        return self._index

    def retrieve(self, query: str, k: int | None = None, task_type: str | None = None) -> list[RetrievedSkill]:
        """Top-k skills for `query` by cosine similarity, restricted to `task_type` when given."""
        return self.retrieve_many([query], k=k, task_types=[task_type])[0]

    def retrieve_many(self, queries: Sequence[str], k: int | None = None,
                      task_types: Sequence[str | None] | None = None) -> list[list[RetrievedSkill]]:
        """Batched `retrieve` (one embedding call for all queries)."""
        index = self._current_index()
        if index.matrix is None or not queries:
            return [[] for _ in queries]
        types = list(task_types) if task_types is not None else [None] * len(queries)
        if len(types) != len(queries):
            raise ValueError(f"retrieve_many: {len(queries)} queries but {len(types)} task types")
        vecs = self._embed(list(queries))
        return [index.search(v, k=k or self.cfg.top_k, task_type=t) for v, t in zip(vecs, types, strict=True)]

    # ------------------------------------------------------------ writes

    def apply(self, proposals: Sequence[ScoredProposal | dict]) -> ApplyResult:
        """Commit a batch under the acceptance rule; returns one decision per input, in input order.
        Inputs that do not parse as a ScoredProposal are recorded as rejected ("malformed")."""
        valid, malformed, bad_at = [], [], set()
        for i, item in enumerate(proposals):
            try:
                valid.append(item if isinstance(item, ScoredProposal) else ScoredProposal.model_validate(item))
            except ValidationError as err:
                malformed.append(_malformed_decision(i, item, err))
                bad_at.add(i)
        limits = {"warmup_steps": self.cfg.warmup_steps, "min_chars": self.cfg.min_chars,
                  "max_chars": self.cfg.max_chars}
        prefetch = [p.text for p in valid if intrinsic_rejection(p, **limits) is None]
        result = self._call(lambda s: s.apply(
            valid, plan=lambda pending, bank: plan_acceptance(pending, bank=bank, **limits),
            embed=self._embed, prefetch=prefetch, malformed=malformed))
        if malformed:
            bad, good = iter(result.decisions[:len(malformed)]), iter(result.decisions[len(malformed):])
            ordered = tuple(next(bad) if i in bad_at else next(good) for i in range(len(proposals)))
            result = result.model_copy(update={"decisions": ordered})
        return result

    def shutdown(self) -> None:
        """Stop the private local server (a configured shared server is left alone)."""
        self._closed = True
        if self._server is not None:
            self._server.stop()
            self._server = None


def _malformed_decision(index: int, item: object, err: ValidationError) -> Decision:
    cid = item.get("candidate_id") if isinstance(item, dict) else None
    step = item.get("step") if isinstance(item, dict) else None
    first = err.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "proposal"
    return Decision(candidate_id=str(cid) if cid is not None else f"<input {index}>",  # store: never deduplicated
                    step=step if isinstance(step, int) and step >= 0 else 0, op=None, outcome="rejected",
                    reason=f"malformed: {where}: {first['msg']} ({err.error_count()} error(s))")

