"""Dead-letter records: the original bytes, key and headers of a record that could not be handled, plus
headers that say why and where it came from (named like Kafka Connect's ``__connect.errors.*``)."""

from __future__ import annotations

import functools

from sluice.operator.failures.containment import error_text
from sluice.operator.record import InputRecord, OutputRecord, message_bytes

HEADER_PREFIX = "sluice.error."
# Headers every output carries so a reader can find the input it came from.
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "sluice.source.topic", "sluice.source.partition", "sluice.source.offset"
DROPPED = HEADER_PREFIX + "dropped"  # what was left out of a dead letter too large for its topic

_MAX_MESSAGE_BYTES = 4096  # a header is no place for a megabyte of stack trace


def dead_letter(record: InputRecord, topic: str, stage: str, error: BaseException | str,
                max_bytes: int | None = None) -> OutputRecord:
    """The dead-letter record for ``record``, which failed at ``stage`` (decode, prepare, infer, encode...).

    Never raises. ``max_bytes``: the most the dead-letter topic accepts. A dead letter over it (an input
    refused for its size, from a topic allowing more than the dead-letter topic) would fail to deliver and
    stop the operator; instead its value, then its input headers, then its key are left out until it fits,
    and ``sluice.error.dropped`` says what was left out (the original stays in the input topic, at the
    partition and offset the other headers name).
    """
    cls, message = error_text(error)
    errors = [
        (HEADER_PREFIX + "stage", stage.encode()),
        (HEADER_PREFIX + "class", cls.encode("utf-8", "replace")),
        (HEADER_PREFIX + "message", message.encode("utf-8", "replace")[:_MAX_MESSAGE_BYTES]),
        (HEADER_PREFIX + "topic", record.tp.topic.encode()),
        (HEADER_PREFIX + "partition", str(record.tp.partition).encode()),
        (HEADER_PREFIX + "offset", str(record.offset).encode()),
    ]
    value, key, headers = record.value, record.key, list(record.headers)
    if max_bytes is None or message_bytes(value, key, headers + errors) <= max_bytes:
        return OutputRecord(topic=topic, value=value, key=key, headers=headers + errors)
    dropped: list[str] = []
    for part in ("value", "headers", "key"):  # least useful to a reader of the dead letters first
        if part == "value" and value:
            dropped.append(f"value ({len(value)} bytes)")
            value = b""
        elif part == "headers" and headers:
            dropped.append(f"{len(headers)} input headers")
            headers = []
        elif part == "key" and key:
            dropped.append(f"key ({len(key)} bytes)")
            key = None
        note = (DROPPED, (", ".join(dropped) + f": the dead letter was over the {max_bytes} bytes its topic "
                          "accepts").encode())
        if message_bytes(value, key, [*headers, *errors, note]) <= max_bytes:
            break
    return OutputRecord(topic=topic, value=value, key=key, headers=[*headers, *errors, note])


def error_headers(headers: list[tuple[str, bytes]]) -> dict[str, str]:
    """What :func:`dead_letter` said about a failure, read back from its headers (without their prefix:
    stage, class, message, topic, partition, offset)."""
    return {k[len(HEADER_PREFIX):]: v.decode("utf-8", "replace") for k, v in headers if k.startswith(HEADER_PREFIX)}


def source_headers(record: InputRecord) -> list[tuple[str, bytes]]:
    """The input's headers plus where the input came from."""
    return [*record.headers, *_partition_headers(record.tp.topic, record.tp.partition),
            (SOURCE_OFFSET, str(record.offset).encode())]


@functools.lru_cache(maxsize=4096)
def _partition_headers(topic: str, partition: int) -> tuple[tuple[str, bytes], ...]:
    return (SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, str(partition).encode())
