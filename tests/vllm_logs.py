"""What vLLM's own log lines look like, for the tests that check where they go."""

import re

VLLM_INFO = re.compile(r"\bINFO \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]")
"""vLLM's record format (level, date, time, [file:line])."""
