"""Text health metrics of `learner.metrics` (pure Python, no model)."""

from __future__ import annotations

import pytest

from learner.metrics import repeated_ngram_ratio


def test_repeated_ngram_ratio():
    assert repeated_ngram_ratio([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    assert repeated_ngram_ratio([1, 2, 3]) == 0.0
    assert repeated_ngram_ratio([5] * 6) == pytest.approx(2 / 3)
