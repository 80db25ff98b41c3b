"""The ``json`` log format: one JSON object per line, with time, level, logger, message and the exception."""

from __future__ import annotations

import io
import json
import logging
import sys
from datetime import datetime, timezone

import pytest

from sluice.logs import JsonFormatter, formatter, iso_utc


def _record(msg: str, *args: object, exc: bool = False, level: int = logging.WARNING) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("sluice.operator.runner", level, __file__, 1, msg, args, exc_info)
    record.created = datetime(2026, 1, 31, 12, 0, 0, 123_000, tzinfo=timezone.utc).timestamp()
    return record


def test_a_record_is_one_json_object_with_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(_record("lost %s (%d partitions)", "reviews", 3))
    assert "\n" not in line
    assert json.loads(line) == {"time": "2026-01-31T12:00:00.123Z", "level": "WARNING",
                                "logger": "sluice.operator.runner", "message": "lost reviews (3 partitions)"}


def test_an_exception_comes_as_its_traceback_text_and_newlines_never_split_the_line() -> None:
    line = JsonFormatter().format(_record("engine failed:\nsee below", exc=True, level=logging.ERROR))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "engine failed:\nsee below" and doc["level"] == "ERROR"
    assert doc["exception"].startswith("Traceback (most recent call last):")
    assert doc["exception"].endswith("ValueError: bad\nvalue")


def test_times_are_utc_iso_8601_to_the_millisecond() -> None:
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1.9996) == "1970-01-01T00:00:01.999Z"


def test_text_stays_the_default_look_and_an_unknown_format_is_refused() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("text"))
    handler.emit(_record("hello"))
    assert stream.getvalue().endswith(" WARNING sluice.operator.runner: hello\n")
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        formatter("xml")
