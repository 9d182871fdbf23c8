"""The user-error contract of `python -m deploy`: a `UserError` (a bad config value, a missing
file, a wrong flag combination) is printed by the CLI as one line on stderr, `error: <problem>:
<fix>`, with exit code 2; a traceback only with `--verbose` or AGENTRL_VERBOSE=1. Every other
exception is a bug and keeps its traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the message names the problem and the fix on one line."""
