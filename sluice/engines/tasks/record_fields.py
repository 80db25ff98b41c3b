"""Reading a task's input out of a decoded record: text values and dotted fields. RecordError when malformed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.engines.engine_contract import RecordError


def as_text(value: Any, task: str, field: str | None = None) -> str:
    """A record value as text (bytes decoded as UTF-8); RecordError for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError(f"{f'field {field!r}' if field else 'the input'} is not valid UTF-8 text") from None
    where = f" in field {field!r}" if field else ""
    raise RecordError(f"task {task} expects a string{where}, got {type(value).__name__}")


def lookup(record: Mapping[str, Any], dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; RecordError naming the field when a part is missing."""
    current: Any = record
    for part in dotted.split("."):
        if not isinstance(current, Mapping) or part not in current:
            raise RecordError(f"the record has no field {dotted!r}")
        current = current[part]
    return current
