"""Property-based fuzz suites over every input the system takes from outside (model output, skill
text, configs, game files, catalogues, run archives, critic replies).

Each test reports the input class it exercises through the session-scoped `fuzz_cases` fixture
(one call per generated example); the terminal summary prints how many examples each class got:

    fuzz cases tried: <class>: N
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

_CASES = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def fuzz_cases(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """`fuzz_cases(input_class)`: count one generated example of that input class."""
    counter = pytestconfig.stash.setdefault(_CASES, Counter())

    def tried(input_class: str) -> None:
        counter[input_class] += 1

    return tried


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    counter = config.stash.get(_CASES, None)
    if not counter:
        return
    terminalreporter.section("fuzz cases tried")
    for input_class, n in sorted(counter.items()):
        terminalreporter.write_line(f"fuzz cases tried: {input_class}: {n}")
    terminalreporter.write_line(f"fuzz cases tried: total: {sum(counter.values())}")
