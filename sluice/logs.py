"""How the operator's log lines look on stderr: ``text`` for people (the default), ``json`` for collectors.

Guarantees of the ``json`` format: every record is exactly one line, one JSON object with at least
``time`` (ISO 8601, UTC, milliseconds, ``Z``), ``level``, ``logger`` and ``message`` (the message with its
arguments filled in), plus ``exception`` -- the traceback text -- when the record carries one (and ``stack``
when it carries a stack). Newlines inside any value are escaped by JSON, so a multi-line message or a
traceback never breaks a line apart. Nothing is dropped: a value JSON cannot encode is written as its
``repr``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's guarantees)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            if not record.exc_text:  # cached on the record, as logging.Formatter does
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=repr)


def iso_utc(created_s: float) -> str:
    """``2026-01-31T12:00:00.123Z``: a ``time.time()`` stamp in UTC, to the millisecond."""
    return datetime.fromtimestamp(created_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of a ``--log-format`` value. ValueError for one not in :data:`FORMATS`."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(FORMATS)}")


def configure(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """The root logger writes records of ``level`` and above (``info``, say) to ``stream`` (stderr) in
    ``fmt``. Like :func:`logging.basicConfig`, it does nothing when the root logger already has a handler
    (an embedding application's, a test runner's)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
