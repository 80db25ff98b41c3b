"""Dead-letter records: the original bytes, key and headers of a record that could not be handled, plus
headers that say why and where it came from (named like Kafka Connect's ``__connect.errors.*``)."""

from __future__ import annotations

import functools

from sluice.operator.record import InputRecord, OutputRecord

HEADER_PREFIX = "sluice.error."
# Headers every output carries so a reader can find the input it came from.
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "sluice.source.topic", "sluice.source.partition", "sluice.source.offset"

_MAX_MESSAGE_BYTES = 4096  # a header is no place for a megabyte of stack trace


def dead_letter(record: InputRecord, topic: str, stage: str, error: BaseException | str) -> OutputRecord:
    """The dead-letter record for ``record``, which failed at ``stage`` (decode, prepare, infer, encode...)."""
    if isinstance(error, BaseException):
        cls, message = type(error).__name__, str(error) or type(error).__name__
    else:
        cls, message = "Error", error
    headers = list(record.headers)
    headers += [
        (HEADER_PREFIX + "stage", stage.encode()),
        (HEADER_PREFIX + "class", cls.encode()),
        (HEADER_PREFIX + "message", message.encode("utf-8", "replace")[:_MAX_MESSAGE_BYTES]),
        (HEADER_PREFIX + "topic", record.tp.topic.encode()),
        (HEADER_PREFIX + "partition", str(record.tp.partition).encode()),
        (HEADER_PREFIX + "offset", str(record.offset).encode()),
    ]
    return OutputRecord(topic=topic, value=record.value, key=record.key, headers=headers)


def source_headers(record: InputRecord) -> list[tuple[str, bytes]]:
    """The input's headers plus where the input came from."""
    return [*record.headers, *_partition_headers(record.tp.topic, record.tp.partition),
            (SOURCE_OFFSET, str(record.offset).encode())]


@functools.lru_cache(maxsize=4096)
def _partition_headers(topic: str, partition: int) -> tuple[tuple[str, bytes], ...]:
    return (SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, str(partition).encode())
