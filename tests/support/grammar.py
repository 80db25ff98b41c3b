"""Helpers for structured-output tests: regexes built from known answers."""

from __future__ import annotations

from collections.abc import Iterable


def literal_regex(text: str) -> str:
    """A regex (Rust syntax, as llguidance and xgrammar read it) matching exactly ``text``.

    Every character but ASCII letters and digits is written as ``\\x{HEX}``, so nothing in ``text`` can
    read as regex syntax.
    """
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def excluding_regex(text: str, excluded: Iterable[str]) -> str:
    """A regex of ``len(text)`` characters, none of them in ``excluded`` (which must not meet ``text``).

    It accepts ``text`` but masks out part of the vocabulary at every position, so a constrained run must
    keep the model's own argmax among many allowed tokens.
    """
    banned = sorted(set(excluded))
    if set(text) & set(banned):
        raise ValueError("the excluded characters must not occur in the text")
    body = "".join(f"\\x{{{ord(c):X}}}" for c in banned)
    return f"[^{body}]{{{len(text)}}}"
