"""Dead letters as JSON lines, beside the output: what failed, where the record came from, and the record.

The operator makes one dead-letter record per failed input (sluice/operator/failures/dead_letter.py: the input's
bytes plus ``sluice.error.*`` headers); the file sink turns it into one line of the dead-letter file::

    {"error": {"stage": "decode", "class": "CodecError", "message": "..."},
     "source": {"file": "corpus/part-1.parquet", "row": 17},
     "record": {...}}

``row`` counts from 0 (for JSON lines, the line number minus one); ``record`` is the input as JSON when it
is JSON (a Parquet row always is), else its text. From a Kafka source, ``source`` names the topic,
partition and offset instead. A pipeline with ``codec.format: openai-batch`` writes OpenAI's error lines
here instead (sluice/codecs/openai_batch.py), as OpenAI's batch API writes its error file.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from sluice.operator.failures.dead_letter import error_headers
from sluice.operator.record import Headers

DeadLetterLine = Callable[[bytes | None, Headers], bytes]  # (the input's value, its headers) -> one line

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def json_line(from_files: bool) -> DeadLetterLine:
    """The line writer for a run reading files (``from_files``) or Kafka topics."""

    def line(value: bytes | None, headers: Headers) -> bytes:
        e = error_headers(headers)
        source: dict[str, object]
        if from_files:
            source = {"file": e.get("topic"), "row": _int(e.get("offset"))}
        else:
            source = {"topic": e.get("topic"), "partition": _int(e.get("partition")), "offset": _int(e.get("offset"))}
        doc = {"error": {"stage": e.get("stage"), "class": e.get("class"), "message": e.get("message")},
               "source": source, "record": record_value(value)}
        return _encoder.encode(doc)

    return line


def record_value(value: bytes | None) -> object:
    """The input as JSON when it is, else as text (invalid UTF-8 replaced), None for a record without one."""
    if value is None:
        return None
    try:
        return _decoder.decode(value)
    except (msgspec.DecodeError, RecursionError, ValueError):  # not JSON (the reason it failed, often)
        return value.decode("utf-8", "replace")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
