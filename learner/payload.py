"""Which response tokens carry the action payload (docs/algorithms.md S4: R_align scores only the text
between "<action>" and "</action>", never the think tokens or the tags).

Chosen approach: when a `TrainRow` has no `payload_mask`, the learner derives it from the
tokenizer, never by re-tokenising. Character offsets of each token come from decoding prefixes
of the response ids (token j covers [len(decode(ids[:j])), len(decode(ids[:j+1])))), found by
binary search, so a row costs O(log n) decodes; the payload span follows the rollout parser
(`rollout_workers/parsing.py`): the first "<action>" (case-insensitive) and the first
"</action>" after it, surrounding whitespace excluded. A token that overlaps the span is a
payload token (a token like ">go" straddling the tag counts). The same holds with constrained
decoding (the response is "<action>X</action>" + EOS) and with think-then-act responses.
No tags, an empty payload or a missing "</action>" give an all-False mask (the step is not
scorable and lowers the anchor's coverage).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_OPEN = re.compile(re.escape("<action>"), re.IGNORECASE)
_CLOSE = re.compile(re.escape("</action>"), re.IGNORECASE)


def payload_char_span(text: str) -> tuple[int, int] | None:
    """[start, end) of the stripped payload between the first "<action>" and the first
    "</action>" after it; None when absent or empty."""
    opened = _OPEN.search(text)
    if opened is None:
        return None
    closed = _CLOSE.search(text, opened.end())
    if closed is None:
        return None
    start, end = opened.end(), closed.start()
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def payload_mask(token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> tuple[bool, ...]:
    """One flag per token: True where the token overlaps the action payload.

    `decode(ids)` must decode a prefix of the response exactly as the full text is decoded
    (special tokens kept, no clean-up), so prefix lengths are character offsets.
    """
    ids = list(token_ids)
    n = len(ids)
    span = payload_char_span(decode(ids))
    if span is None:
        return (False,) * n
    start, end = span
    cache: dict[int, int] = {0: 0}

    def prefix_len(k: int) -> int:  # characters decoded from the first k tokens
        if k not in cache:
            cache[k] = len(decode(ids[:k]))
        return cache[k]

    def first_k(pred: Callable[[int], bool]) -> int:  # smallest k in [0, n] with pred(k)
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    first = first_k(lambda k: prefix_len(k + 1) > start if k < n else True)  # token ending after start
    stop = first_k(lambda k: prefix_len(k) >= end)  # first token starting at or after end
    return tuple(first <= j < stop for j in range(n))


def free_payload_mask(flags: Sequence[bool | float], allowed_token_ids: Sequence[Sequence[int]] | None) -> list[bool]:
    """`flags` without the positions the decoding constraint forced (exactly one allowed id): their
    log-prob is 0 under every prompt, so in R_align's J they would only dilute the payload mean
    (docs/algorithms.md S4). Unconstrained rows (None) keep every flag."""
    if allowed_token_ids is None:
        return [bool(f) for f in flags]
    if len(allowed_token_ids) != len(flags):
        raise ValueError(f"{len(allowed_token_ids)} allowed-id entries for {len(flags)} payload flags")
    return [bool(f) and len(a) != 1 for f, a in zip(flags, allowed_token_ids, strict=True)]
