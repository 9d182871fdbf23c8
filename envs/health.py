"""Text health measures that every layer reports: the repeated n-gram ratio of a response (the
rollout workers summarise each turn with it, the learner reports it on the responses it trained on)."""

from __future__ import annotations

from collections.abc import Sequence


def repeated_ngram_ratio(token_ids: Sequence[int], *, n: int = 4) -> float:
    """Share of a response's n-grams that repeat an earlier n-gram of the same response:
    (count - distinct) / count, 0 when the response has fewer than n tokens (SMRC-SD's
    "repeated 4-gram ratio" health metric)."""
    ids = tuple(token_ids)  # one conversion (arrays slice slowly one window at a time)
    grams = list(zip(*(ids[k:] for k in range(n))))  # the n-grams, built in C
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0
