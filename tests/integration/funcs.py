"""User functions the integration tests plug into the ``python`` engine."""

from __future__ import annotations

import time


def tag(texts: list[str]) -> list[str]:
    return [f"<{t.upper()}>" for t in texts]


def slow_tag(texts: list[str]) -> list[str]:
    time.sleep(0.02)  # a slow model: keeps records in flight when the test sends SIGTERM
    return tag(texts)


def fail_on_poison(texts: list[str]) -> list[str]:
    if any("poison" in t for t in texts):
        raise ValueError("the model cannot digest 'poison'")
    return tag(texts)


def inflate(texts: list[str]) -> list[str]:
    """Blows up the result of records that ask for it: more than a small output topic accepts."""
    return ["x" * 50_000 if "big" in t else t.upper() for t in texts]


def type_flip(texts: list[str]) -> list[object]:
    """Text results for rows below 2000, then lists: a result type that changes halfway through a file."""
    return [t.upper() if int(t.split()[-1]) < 2000 else [t] for t in texts]
