"""Skill text validation (pure). Skill text is data: the prompt renders it inside a delimited block
and it must never read as instructions to the harness. A text that fails returns a reason tag
("length", "charset", "control_char", "instruction") followed by details; None means valid.

Allowed characters: printable ASCII, newline and tab (whitespace the duplicate key folds away),
Latin-1/Latin Extended-A/B letters and the common typographic punctuation (dashes, curly quotes,
ellipsis). Everything else is refused, which also covers CJK text (UniSkill scores skills with Chinese text as unsupported) and invisible format
characters (zero-width, bidi overrides) that could hide content from a reviewer. The instruction
patterns are matched on the text and on its NFKC case-folded form, so compatibility characters
inside the allowed ranges ("\u00aa" for "a", "\u00ba" for "o", "\u017f" for "s", "\u00df" for "ss",
a no-break space for a space) cannot spell a marker the plain text would be refused for."""

from __future__ import annotations

import re
import unicodedata

_TYPOGRAPHIC = set("\u2010\u2011\u2012\u2013\u2014\u2018\u2019\u201c\u201d\u2022\u2026")

_INSTRUCTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("override", re.compile(
        r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(previous|prior|above|earlier|all|system|your)\b"
        r"[^.\n]{0,20}\b(instructions?|prompts?|rules|directions|messages?)\b", re.IGNORECASE)),
    ("role_marker", re.compile(r"(^|\n)\s*#*\s*(system|assistant|user|developer|human|tool)\s*:", re.IGNORECASE)),
    ("role_marker", re.compile(r"\[/?(inst|system|sys)\]|<<\s*/?sys\s*>>", re.IGNORECASE)),
    ("special_token", re.compile(r"<\|[^|>]{1,40}\|>")),
    ("markup_tag", re.compile(r"<\s*/?\s*[a-z_][a-z0-9_:-]{0,40}\s*/?\s*>", re.IGNORECASE)),
    ("persona", re.compile(r"\byou are now\b|\bnew (system )?instructions\b|\bdeveloper mode\b", re.IGNORECASE)),
)


def normalise_text(text: str) -> str:
    """The duplicate key of S5: runs of whitespace collapsed to one space, ends stripped."""
    return " ".join(text.split())


def _bad_char(ch: str) -> str | None:
    if ch in "\n\t":
        return None
    cat = unicodedata.category(ch)
    if cat.startswith("C"):
        return "control_char"
    code = ord(ch)
    if 0x20 <= code < 0x7F or 0xA0 <= code <= 0x24F or ch in _TYPOGRAPHIC:
        return None
    return "charset"


def validate_skill_text(text: object, *, min_chars: int, max_chars: int) -> str | None:
    """Why `text` may not enter the bank, or None when it may. Checks run cheapest first."""
    if not isinstance(text, str):
        return f"invalid_type: skill text must be a string, got {type(text).__name__}"
    n = len(normalise_text(text))
    if n < min_chars or len(text) > max_chars:
        return f"length: {n} characters after normalisation ({len(text)} raw); allowed {min_chars}..{max_chars}"
    for i, ch in enumerate(text):
        tag = _bad_char(ch)
        if tag is not None:
            return f"{tag}: character U+{ord(ch):04X} at offset {i} is not allowed in skill text"
    folded = unicodedata.normalize("NFKC", text).casefold()
    for tag, pattern in _INSTRUCTION_PATTERNS:
        m = pattern.search(text) or pattern.search(folded)
        if m:
            return f"instruction: {tag} {m.group(0).strip()!r} reads as an instruction to the harness, not a skill"
    return None


def reason_tag(reason: str) -> str:
    """The tag of a reason string ("length: 3 characters ..." -> "length")."""
    return reason.split(":", 1)[0].strip()
