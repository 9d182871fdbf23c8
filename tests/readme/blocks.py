"""The commands of README.md's fenced ```bash blocks, one per shell command line, in order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")
_COMMENT = re.compile(r"\s+#\s.*$")


@dataclass(frozen=True)
class Block:
    heading: str
    """The `## ` heading the block sits under."""
    commands: tuple[str, ...]
    """Each command on one line: continuations joined, comments and blank lines dropped, spaces collapsed."""


def _commands(lines: list[str]) -> tuple[str, ...]:
    joined: list[str] = []
    pending = ""
    for line in lines:
        line = _COMMENT.sub("", line).strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(" ".join((pending + line).split()))
        pending = ""
    return tuple(joined)


def fenced_blocks(text: str, language: str) -> list[tuple[str, list[str]]]:
    """(heading, lines) of every fenced block of `language`, in order."""
    blocks: list[tuple[str, list[str]]] = []
    heading, current, lang = "", None, ""
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if current is None and line.startswith("## "):
            heading = line[3:].strip()
        elif fence and current is None:
            current, lang = [], fence.group(1)
        elif fence and current is not None:
            if lang == language:
                blocks.append((heading, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def bash_blocks(readme: Path) -> list[Block]:
    return [Block(h, _commands(lines)) for h, lines in fenced_blocks(readme.read_text(), "bash")]
