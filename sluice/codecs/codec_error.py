"""The error every codec raises for one record it cannot read or write (its own module: the JSON codec and
the schema registry formats both raise it, and neither imports the other)."""

from __future__ import annotations


class CodecError(Exception):
    """A record cannot be decoded or its result cannot be encoded. ``stage`` is 'decode' or 'encode'."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
