"""The LLM critic's replies (skillbank_service.critics.LLMCritic) from a real local HTTP endpoint,
and the reply parser shared with the policy critic.

The endpoint is a raw TCP server on loopback that answers each request with a scripted byte
stream: well-formed or malformed JSON, wrong shapes, huge bodies, lying Content-Length, bad
status lines, connections dropped mid-reply, and bodies trickled slower than any per-read
timeout. Properties: `judge` never raises; a reply that is not a verdict gives `failed=True`,
`passed=False` and a "critic_<tag>: ..." reason; a good verdict passes through unchanged; every
judgement ends within its time bound (retries x the per-attempt deadline, plus backoff).
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass

import pytest
from fuzzing import fuzz_settings, scaled
from hypothesis import given, settings
from hypothesis import strategies as st

from skillbank_service.config import LLMCriticConfig
from skillbank_service.critics import LLMCritic, PolicyCritic, parse_verdict
from skillbank_service.types import CriticRequest

FUZZ = fuzz_settings(8)
SLOW_FUZZ = settings(FUZZ, max_examples=scaled(3))
PARSE_FUZZ = fuzz_settings(300)
CLASS = "critic replies"
TIMEOUT_S = 0.4
REQUEST = CriticRequest(candidate_id="c1", op="add", task_type="pick_and_place_simple",
                        text="Open each closed receptacle before searching it.",
                        source_trajectory="> open cabinet 1\nYou open the cabinet 1.")


@dataclass
class Reply:
    """What the endpoint writes back: `head` (status line + headers, without the blank line),
    then `body` in `chunk`-byte pieces `pause` seconds apart; `drop_after` closes the connection
    after that many body bytes."""

    head: bytes
    body: bytes
    chunk: int = 1 << 16
    pause: float = 0.0
    drop_after: int | None = None


class _Endpoint(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    reply: Reply
    last_reasons: list[str]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536) or b"!"
                if data.endswith(b"!"):
                    return
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:
                rest += sock.recv(65536) or b""
            reply: Reply = self.server.reply  # type: ignore[attr-defined]
            sock.sendall(reply.head + b"\r\n\r\n")
            body = reply.body if reply.drop_after is None else reply.body[: reply.drop_after]
            for i in range(0, len(body), reply.chunk):
                sock.sendall(body[i : i + reply.chunk])
                if reply.pause:
                    time.sleep(reply.pause)
        except OSError:  # the critic gave up on this reply: fine
            return


@pytest.fixture(scope="module")
def endpoint():
    server = _Endpoint(("127.0.0.1", 0), _Handler)
    server.last_reasons = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _completion(content: object) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


def _head(status: bytes, body: bytes, *, length: int | None = None, extra: bytes = b"") -> bytes:
    n = len(body) if length is None else length
    return status + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(n).encode() + extra


VERDICT = st.fixed_dictionaries({"op_reasonable": st.booleans(), "content_supported": st.booleans()},
                                optional={"reason": st.one_of(st.text(max_size=40), st.integers(), st.none())})
JUNK = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=3)), max_leaves=6)


FAST_KINDS = ["good", "good_wrapped", "content_junk", "envelope_junk", "not_json", "deep_json", "short_body",
              "bad_status", "http_error", "empty", "not_utf8", "chunked_junk", "many_braces"]
SLOW_KINDS = ["huge", "trickle"]


@st.composite
def replies(draw: st.DrawFn, kind: str) -> tuple[Reply, dict | None]:
    """(reply, the verdict it carries when it is a well-formed one)."""
    verdict = draw(VERDICT)
    ok = b"HTTP/1.1 200 OK"
    match kind:
        case "good" | "good_wrapped":
            text = json.dumps(verdict)
            if kind == "good_wrapped":
                text = draw(st.text(max_size=20).filter(lambda t: "{" not in t)) + text + draw(st.text(max_size=20))
            body = _completion(text)
            return Reply(_head(ok, body), body, chunk=draw(st.sampled_from([1 << 16, 7]))), verdict
        case "content_junk":
            body = _completion(draw(st.one_of(JUNK, st.text(max_size=60))))
        case "envelope_junk":
            body = json.dumps(draw(JUNK)).encode()
        case "not_json":
            body = draw(st.binary(max_size=80))
        case "deep_json":
            depth = draw(st.sampled_from([5_000, 100_000]))
            body = (b"[" * depth + b"]" * depth) if draw(st.booleans()) else _completion('{"a":' * depth)
        case "huge":
            body = _completion("x" * (8 << 20))
        case "trickle":  # always a byte in flight: no single read ever times out
            body = _completion(json.dumps(verdict))
            return Reply(_head(ok, body), body, chunk=1, pause=TIMEOUT_S / 3), None
        case "short_body":
            body = _completion(json.dumps(verdict))
            return Reply(_head(ok, body, length=len(body) + 50), body), None
        case "bad_status":
            body = _completion(json.dumps(verdict))
            status = draw(st.sampled_from([b"HTTP/1.1 abc OK", b"garbage", b"HTTP/9 200", b"", b"\xff\xfe"]))
            return Reply(_head(status, body), body), None
        case "http_error":
            code = draw(st.sampled_from([b"400 Bad Request", b"429 Too Many", b"500 Oops", b"503 Busy", b"302 Found"]))
            body = _completion(json.dumps(verdict))
            return Reply(_head(b"HTTP/1.1 " + code, body), body), None
        case "empty":
            body = b""
        case "not_utf8":
            body = b"\xff\xfe\xfa" + _completion(json.dumps(verdict))
        case "chunked_junk":
            body = b"zz\r\n" + _completion(json.dumps(verdict))
            return Reply(ok + b"\r\nTransfer-Encoding: chunked", body), None
        case "many_braces":
            body = _completion("{" * 200_000 + json.dumps(verdict)[:-1])
    drop = draw(st.one_of(st.none(), st.integers(0, 40))) if kind not in ("huge",) else None
    return Reply(_head(ok, body), body, drop_after=drop), None


@pytest.mark.parametrize("kind", FAST_KINDS)
def test_any_reply_gives_a_verdict_in_bounded_time(fuzz_cases, endpoint, kind):
    @FUZZ
    @given(case=replies(kind), retries=st.integers(0, 1))
    def check(case, retries):
        _judge_within_bound(fuzz_cases, endpoint, case, retries)

    check()


@pytest.mark.parametrize("kind", SLOW_KINDS)
def test_huge_and_trickled_replies_fail_in_bounded_time(fuzz_cases, endpoint, kind):
    @SLOW_FUZZ
    @given(case=replies(kind), retries=st.integers(0, 1))
    def check(case, retries):
        _judge_within_bound(fuzz_cases, endpoint, case, retries)
        assert endpoint.last_reasons[-1].startswith("critic_timeout" if kind == "trickle" else "critic_bad_json")

    check()


def _judge_within_bound(fuzz_cases, endpoint, case: tuple[Reply, dict | None], retries: int) -> None:
    fuzz_cases(CLASS)
    reply, verdict = case
    endpoint.reply = reply
    cfg = LLMCriticConfig(base_url=f"http://127.0.0.1:{endpoint.server_address[1]}/v1", timeout_s=TIMEOUT_S,
                          max_retries=retries, backoff_s=0.0, allow_unavailable=True)
    critic = LLMCritic(cfg)
    start = time.monotonic()
    got = critic.judge(REQUEST)
    elapsed = time.monotonic() - start
    endpoint.last_reasons.append(got.reason)
    # each attempt ends within its deadline; the slack is CPU time on a loaded machine (a reply
    # trickled slower than any per-read timeout would take 16 s here without the deadline)
    assert elapsed <= (retries + 1) * (TIMEOUT_S + 1.5) + 2.0, elapsed
    if verdict is not None:
        assert not got.failed and got.op_reasonable == verdict["op_reasonable"]
        assert got.passed == (verdict["op_reasonable"] and verdict["content_supported"])
        return
    if got.failed:
        assert not got.passed and not got.op_reasonable and not got.content_supported
        assert got.reason.startswith("critic_") and ": " in got.reason, got.reason
        assert sum(critic.failures.values()) == 1


@PARSE_FUZZ
@given(text=st.one_of(st.text(max_size=300), st.builds(lambda a, v, b: a + json.dumps(v) + b, st.text(max_size=30),
                                                       VERDICT, st.text(max_size=30))))
def test_policy_critic_replies_give_a_verdict(fuzz_cases, text):
    fuzz_cases(CLASS)
    got = PolicyCritic(lambda _prompt: text).judge(REQUEST)
    assert got.failed or got.passed == (got.op_reasonable and got.content_supported)
    if got.failed:
        assert got.reason.startswith("critic_")
    try:
        parsed = parse_verdict(text, "policy")
    except ValueError:
        assert got.failed
        return
    assert not got.failed and parsed == got


def test_deeply_nested_reply_is_a_bad_verdict_quickly(fuzz_cases):
    fuzz_cases(CLASS)
    start = time.monotonic()
    got = PolicyCritic(lambda _prompt: '{"a":' * 200_000).judge(REQUEST)
    assert got.failed and time.monotonic() - start < 5
