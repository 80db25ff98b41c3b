"""Example user functions for the ``python`` engine: each takes a list of inputs and returns a list."""

from __future__ import annotations


def shout(texts: list[str]) -> list[str]:
    """Upper-case every text (the demo's 'model')."""
    return [t.upper() for t in texts]


def word_count(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


def noop(values: list[object]) -> list[object]:
    """Returns its inputs: measures the operator's own overhead."""
    return values
