"""What every fuzz suite shares: example budgets (scaled by FUZZ_SCALE), one settings shape, and
arbitrary JSON values for mutating structured files."""

from __future__ import annotations

import os
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def scaled(n: int) -> int:
    """Examples per test; FUZZ_SCALE=10 runs a ten times deeper search."""
    return max(1, round(n * float(os.environ.get("FUZZ_SCALE", "1"))))


def fuzz_settings(examples: int) -> settings:
    """`examples` (scaled) per test, no deadline, nothing written to .hypothesis/."""
    return settings(max_examples=scaled(examples), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])


def json_junk(*, max_int: int | None = None, max_text: int = 8) -> st.SearchStrategy:
    """Any small JSON value (nested lists and objects of scalars)."""
    ints = st.integers() if max_int is None else st.integers(-5, max_int)
    scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False), st.text(max_size=max_text))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)


def replay_mutated(replay: Callable, root, path) -> None:
    """Replay a mutated transcript file on the embedded backend: either a report, or a ValueError /
    TypeError raised on purpose that names the file (and line)."""
    try:
        report = replay(backend="embedded", data_path=root, transcripts=path)
    except (ValueError, TypeError) as err:
        assert str(path) in str(err), repr(err)
        return
    assert 0 <= report.identical_steps <= report.total_steps
    report.lines()
