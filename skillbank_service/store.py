"""`SkillStore`: the skill bank in Redis (the only module importing redis-py).

Keys, all under `<prefix>:` (the run name, so runs sharing one server never mix):
- `version`      bank version: +1 per committed batch that wrote at least one edit
- `next_id`      skill id counter (ids are "s000001", ...; unique and increasing, with a gap
                 where a writer reserved ids and then lost a race that shrank its batch)
- `skills`       hash skill_id -> Skill JSON
- `embeddings`   hash skill_id -> float32 little-endian vector of the current text
- `dedup`        hash "<task_type>\\x1f<normalised text>" -> skill_id (the S5 duplicate key)
- `guard:skill:<id>`, `guard:dedup:<sha1 of the dedup field>`  counters bumped by every write to
                 that skill / duplicate key: what a writer WATCHes
- `history`      list (append-only) of HistoryEntry JSON, every applied edit
- `history:<id>` list (append-only) of the same entries for one skill
- `decisions`    list (append-only) of Decision JSON, one per proposal ever passed to `apply`
- `decided:<candidate id>`  the Decision JSON recorded for that candidate (what makes `apply`
                 idempotent; inputs without a candidate id, "<input N>", are not keyed)
- `counters`     hash: adds, updates, outcome:<outcome>, reason:<tag>
- `schema`       schema version of the JSON values

`apply` is an optimistic transaction with fine-grained conflicts: WATCH the guards of exactly
what the batch depends on (its UPDATE targets and its duplicate keys), read those entries, run the
pure acceptance rule, then MULTI/EXEC the writes, their guards, the history, the decisions, the
counters and the version together. A concurrent writer that changed one of those entries first
makes EXEC fail and the batch is re-planned against the new bank, so no update is lost and every
decision matches the bank it was taken against; writers touching disjoint skills and texts never
conflict. Losers back off exponentially (with jitter) before re-planning.

`apply` is idempotent by candidate id: the transaction also WATCHes the batch's `decided:` keys,
and a proposal that already has a recorded decision is not planned again; its recorded decision
is returned. A caller may therefore repeat a call whose reply it never saw (the server died after
EXEC committed, the actor was restarted mid-call) and no edit is applied twice. A connection lost
while WATCHing surfaces as a WatchError (redis-py), so the loop re-reads the `decided:` keys before
anything is re-planned; `is_unavailable` tells callers which errors a reconnect may cure.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Sequence

import numpy as np
import redis

from skillbank_service.acceptance import AcceptancePlan, BankView, DedupKey, dedup_key
from skillbank_service.config import SkillBankConfig
from skillbank_service.types import (
    SCHEMA_VERSION,
    ApplyResult,
    BankSnapshot,
    BankStats,
    Decision,
    HistoryEntry,
    Provenance,
    ScoredProposal,
    Skill,
)
from skillbank_service.validation import reason_tag

Planner = Callable[[Sequence[ScoredProposal], BankView], AcceptancePlan]
"""plan(the proposals still undecided, the bank they touch) -> the acceptance rule's plan."""
Embedder = Callable[[list[str]], np.ndarray]
_ANONYMOUS = re.compile(r"<input \d+>")
"""The candidate id the service gives an input that carried none (never deduplicated)."""


class SchemaMismatchError(RuntimeError):
    pass


class InsecureServerError(ValueError):
    """A shared skill-bank server configured without a password."""


def is_unavailable(err: BaseException) -> bool:
    """A connection-level failure (server down, restarting, loading its AOF, unreachable): worth
    retrying once reconnected. A refused password is not."""
    return (isinstance(err, redis.ConnectionError | redis.TimeoutError)
            and not isinstance(err, redis.AuthenticationError | redis.exceptions.AuthorizationError))


def connect(cfg: SkillBankConfig, url: str | None = None) -> redis.Redis:
    """A client for `url` (default cfg.url) with the password from $cfg.password_env (or the URL's),
    and TLS when cfg.tls or the URL is rediss:// (verified against cfg.tls_ca_file, else the system
    store). A TCP server with no password is refused unless cfg.allow_no_password."""
    import os
    from urllib.parse import urlsplit

    url = url or cfg.url
    if url is None:
        raise ValueError("skillbank.url is None: start a LocalRedisServer or configure skillbank.url")
    if cfg.tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://"):]
    kwargs: dict = {"socket_timeout": 30, "socket_connect_timeout": 10, "health_check_interval": 30}
    password = os.environ.get(cfg.password_env)
    if password:
        kwargs["password"] = password
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss") and not (password or parts.password) and not cfg.allow_no_password:
        raise InsecureServerError(
            f"skillbank.url {parts.scheme}://{parts.hostname}:{parts.port} has no password: set "
            f"${cfg.password_env} on every node (or put it in the URL), or set "
            "uniskill.bank.allow_no_password=true for a server only you can reach")
    if url.startswith("rediss://") and cfg.tls_ca_file is not None:
        kwargs["ssl_ca_certs"] = cfg.tls_ca_file
    return redis.Redis.from_url(url, **kwargs)


class SkillStore:
    def __init__(self, client: redis.Redis, prefix: str, *, max_write_attempts: int = 128):
        self._r = client
        self._p = prefix
        self._max_attempts = max_write_attempts
        self._check_schema()

    def _k(self, name: str) -> str:
        return f"{self._p}:{name}"

    def _check_schema(self) -> None:
        self._r.setnx(self._k("schema"), SCHEMA_VERSION)
        found = int(self._r.get(self._k("schema")))
        if found != SCHEMA_VERSION:
            raise SchemaMismatchError(f"skill bank {self._p!r} holds schema {found}, this code writes "
                                      f"{SCHEMA_VERSION}: use a new skillbank.key_prefix or migrate the bank")

    def ping(self) -> bool:
        return bool(self._r.ping())

    # ---------------------------------------------------------------- reads

    def version(self) -> int:
        return int(self._r.get(self._k("version")) or 0)

    def snapshot(self) -> BankSnapshot:
        version, raw = self._read_atomically("skills")
        skills = sorted((Skill.model_validate_json(v) for v in raw.values()), key=lambda s: s.skill_id)
        return BankSnapshot(version=version, skills=tuple(skills))

    def embeddings(self) -> tuple[int, list[Skill], np.ndarray | None]:
        """(version, skills, matrix of their embeddings in the same order) read in one transaction."""
        with self._r.pipeline(transaction=True) as pipe:
            pipe.get(self._k("version")).hgetall(self._k("skills")).hgetall(self._k("embeddings"))
            version, raw, vecs = pipe.execute()
        skills = sorted((Skill.model_validate_json(v) for v in raw.values()), key=lambda s: s.skill_id)
        if not skills:
            return int(version or 0), [], None
        matrix = np.stack([np.frombuffer(vecs[s.skill_id.encode()], dtype="<f4") for s in skills])
        return int(version or 0), skills, matrix

    def _read_atomically(self, key: str) -> tuple[int, dict]:
        with self._r.pipeline(transaction=True) as pipe:
            pipe.get(self._k("version")).hgetall(self._k(key))
            version, raw = pipe.execute()
        return int(version or 0), raw

    def get(self, skill_id: str) -> Skill | None:
        raw = self._r.hget(self._k("skills"), skill_id)
        return Skill.model_validate_json(raw) if raw is not None else None

    def history(self, skill_id: str | None = None) -> list[HistoryEntry]:
        key = self._k(f"history:{skill_id}") if skill_id else self._k("history")
        return [HistoryEntry.model_validate_json(x) for x in self._r.lrange(key, 0, -1)]

    def decisions(self, last: int | None = None) -> list[Decision]:
        start = -last if last else 0
        return [Decision.model_validate_json(x) for x in self._r.lrange(self._k("decisions"), start, -1)]

    def stats(self) -> BankStats:
        with self._r.pipeline(transaction=True) as pipe:
            pipe.get(self._k("version")).hgetall(self._k("skills")).hgetall(self._k("counters"))
            version, raw, raw_counters = pipe.execute()
        version = int(version or 0)
        counters = {k.decode(): int(v) for k, v in raw_counters.items()}
        per_type: dict[str, int] = {}
        for v in raw.values():
            t = json.loads(v)["task_type"]
            per_type[t] = per_type.get(t, 0) + 1
        return BankStats(
            version=version, num_skills=dict(sorted(per_type.items())),
            adds=counters.get("adds", 0), updates=counters.get("updates", 0),
            decisions={k.split(":", 1)[1]: v for k, v in sorted(counters.items()) if k.startswith("outcome:")},
            rejections={k.split(":", 1)[1]: v for k, v in sorted(counters.items()) if k.startswith("reason:")},
        )

    # ---------------------------------------------------------------- writes

    def apply(self, proposals: Sequence[ScoredProposal], *, plan: Planner, embed: Embedder,
              prefetch: Sequence[str] = (), malformed: Sequence[Decision] = ()) -> ApplyResult:
        """Plan with the pure rule against the current bank and commit it atomically (see module doc).
        `prefetch` texts are embedded before the transaction (keeping the WATCH window short);
        `malformed` are decisions on inputs that never parsed into a proposal, logged in the same
        transaction ahead of the planned ones and returned first. Inputs whose candidate id already
        has a recorded decision get that decision back and write nothing (`replayed`)."""
        vectors = _embed_into({}, list(dict.fromkeys(prefetch)), embed)
        targets = sorted({p.target_skill_id for p in proposals if p.op == "update" and p.target_skill_id})
        fields = list(dict.fromkeys(_field(dedup_key(p.task_type, p.text)) for p in proposals if p.op != "no_edit"))
        guards = [self._skill_guard(t) for t in targets] + [self._dedup_guard(f) for f in fields]
        cids = list(dict.fromkeys(c for c in (*(d.candidate_id for d in malformed),
                                              *(p.candidate_id for p in proposals)) if not _ANONYMOUS.fullmatch(c)))
        marks = [self._decided_key(c) for c in cids]
        reserved: list[int] = []
        for attempt in range(1, self._max_attempts + 1):
            with self._r.pipeline(transaction=True) as pipe:
                try:
                    if guards or marks:
                        pipe.watch(*guards, *marks)
                    recorded = pipe.mget(marks) if marks else []
                    done = {c: Decision.model_validate_json(raw) for c, raw in zip(cids, recorded) if raw}
                    pending = [p for p in proposals if p.candidate_id not in done]
                    found = pipe.hmget(self._k("skills"), targets) if targets else []
                    bank = {sid: Skill.model_validate_json(raw) for sid, raw in zip(targets, found) if raw}
                    owners = pipe.hmget(self._k("dedup"), fields) if fields else []
                    index = {_unfield(f): sid.decode() for f, sid in zip(fields, owners) if sid}
                    result = plan(pending, BankView({sid: (s.task_type, s.text) for sid, s in bank.items()}, index))
                    if len(result.adds) > len(reserved):  # ids are reserved outside the transaction
                        n = len(result.adds) - len(reserved)
                        last = int(self._r.incrby(self._k("next_id"), n))
                        reserved += range(last - n + 1, last + 1)
                    _embed_into(vectors, [p.text for p in (*result.updates, *result.adds)], embed)
                    pipe.multi()
                    for d in malformed:
                        if d.candidate_id not in done:
                            self._queue_decision(pipe, d)
                    out = self._queue_writes(pipe, result, bank, reserved, vectors)
                    replies = pipe.execute()
                except redis.WatchError:
                    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 10))))
                    continue
            version = int(replies[-1]) if out["writes"] else self.version()
            fresh = iter(out["decisions"])
            decisions = (*(done.get(d.candidate_id, d) for d in malformed),
                         *(done[p.candidate_id] if p.candidate_id in done else next(fresh) for p in proposals))
            accepted = [d.op for d in decisions if d.outcome == "accepted"]
            return ApplyResult(bank_version=version, decisions=decisions, num_added=accepted.count("add"),
                               num_updated=accepted.count("update"), attempts=attempt,
                               replayed=sum(d.candidate_id in done for d in (*malformed, *proposals)))
        raise RuntimeError(f"skill bank apply lost the race {self._max_attempts} times in a row; raise "
                           "skillbank.max_write_attempts or reduce concurrent writers on the same skills")

    def _decided_key(self, candidate_id: str) -> str:
        return self._k(f"decided:{candidate_id}")

    def _skill_guard(self, skill_id: str) -> str:
        return self._k(f"guard:skill:{skill_id}")

    def _dedup_guard(self, field: str) -> str:
        return self._k(f"guard:dedup:{hashlib.sha1(field.encode()).hexdigest()}")

    def _queue_writes(self, pipe, result: AcceptancePlan, bank: dict[str, Skill], ids: list[int],
                      vectors: dict[str, np.ndarray]) -> dict:
        """Queue the plan's edits, history, decisions and counters; the version INCR goes last."""
        edits: list[tuple[Skill, HistoryEntry]] = []
        for p in result.updates:
            old = bank[p.target_skill_id or ""]
            skill = Skill(skill_id=old.skill_id, task_type=old.task_type, text=p.text,
                          revision=old.revision + 1, provenance=_provenance(p))
            edits.append((skill, _entry(skill, p, "update", previous=old.text)))
            old_field = _field(dedup_key(old.task_type, old.text))
            pipe.hdel(self._k("dedup"), old_field)
            pipe.incr(self._dedup_guard(old_field))
        for n, p in zip(ids, result.adds):
            skill = Skill(skill_id=f"s{n:06d}", task_type=p.task_type, text=p.text, revision=1,
                          provenance=_provenance(p))
            edits.append((skill, _entry(skill, p, "add", previous=None)))
        placed: dict[str, tuple[str, int]] = {}
        for skill, e in edits:
            field = _field(dedup_key(e.task_type, e.text))
            pipe.hset(self._k("skills"), e.skill_id, skill.model_dump_json())
            pipe.hset(self._k("dedup"), field, e.skill_id)
            pipe.hset(self._k("embeddings"), e.skill_id, vectors[e.text].tobytes())
            pipe.incr(self._skill_guard(e.skill_id))
            pipe.incr(self._dedup_guard(field))
            pipe.rpush(self._k("history"), e.model_dump_json())
            pipe.rpush(self._k(f"history:{e.skill_id}"), e.model_dump_json())
            placed[e.candidate_id] = (e.skill_id, e.revision)
        decisions = []
        for v in result.verdicts:
            sid, rev = placed.get(v.proposal.candidate_id, (None, None))
            d = Decision(candidate_id=v.proposal.candidate_id, step=v.proposal.step, op=v.proposal.op,
                         outcome=v.outcome, reason=v.reason, skill_id=sid, revision=rev)
            decisions.append(d)
            self._queue_decision(pipe, d)
        if edits:
            pipe.hincrby(self._k("counters"), "adds", len(result.adds))
            pipe.hincrby(self._k("counters"), "updates", len(result.updates))
            pipe.incr(self._k("version"))
        return {"writes": len(edits), "decisions": decisions}

    def _queue_decision(self, pipe, d: Decision) -> None:
        pipe.rpush(self._k("decisions"), d.model_dump_json())
        if not _ANONYMOUS.fullmatch(d.candidate_id):
            pipe.set(self._decided_key(d.candidate_id), d.model_dump_json())
        pipe.hincrby(self._k("counters"), f"outcome:{d.outcome}", 1)
        if d.outcome != "accepted":
            pipe.hincrby(self._k("counters"), f"reason:{reason_tag(d.reason)}", 1)


def _field(key: DedupKey) -> str:
    return f"{key[0]}\x1f{key[1]}"


def _unfield(field: str) -> DedupKey:
    task_type, text = field.split("\x1f", 1)
    return (task_type, text)


def _embed_into(vectors: dict[str, np.ndarray], texts: list[str], embed: Embedder) -> dict[str, np.ndarray]:
    missing = [t for t in dict.fromkeys(texts) if t not in vectors]
    if missing:
        vectors.update(zip(missing, np.asarray(embed(missing), dtype="<f4"), strict=True))
    return vectors


def _provenance(p: ScoredProposal) -> Provenance:
    assert p.r_align is not None and p.delta_plus is not None
    return Provenance(candidate_id=p.candidate_id, step=p.step, source_trajectory_ids=p.source_trajectory_ids,
                      r_align=p.r_align, delta_plus=p.delta_plus, delta_minus=p.delta_minus, verdict=p.verdict)


def _entry(skill: Skill, p: ScoredProposal, op: str, *, previous: str | None) -> HistoryEntry:
    assert p.r_align is not None
    return HistoryEntry(op=op, skill_id=skill.skill_id, revision=skill.revision,
                        task_type=skill.task_type, text=skill.text, previous_text=previous,
                        candidate_id=p.candidate_id, step=p.step, r_align=p.r_align)
