"""Helpers for structured-output tests: regexes built from known answers, read alike by llguidance (Rust
``regex`` syntax) and xgrammar (ECMAScript-like)."""

from __future__ import annotations

from collections.abc import Iterable

_META = set("\\.+*?()|[]{}^$")
_CLASS_META = set("\\[]^-&~")
_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def literal_regex(text: str) -> str:
    """A regex matching exactly ``text``: meta characters escaped, newlines and tabs as ``\\n``, ``\\t``."""
    return "".join(_CONTROL.get(c, "\\" + c if c in _META else c) for c in text)


def excluding_regex(text: str, excluded: Iterable[str]) -> str:
    """A regex of ``len(text)`` characters, none of them in ``excluded`` (which must not meet ``text``).

    It accepts ``text`` but masks out part of the vocabulary at every position, so a constrained run must
    keep the model's own argmax among many allowed tokens.
    """
    banned = sorted(set(excluded))
    if set(text) & set(banned):
        raise ValueError("the excluded characters must not occur in the text")
    body = "".join(_CONTROL.get(c, "\\" + c if c in _CLASS_META else c) for c in banned)
    return f"[^{body}]{{{len(text)}}}"
