"""Plain data that travels between the operator's stages."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

Headers = list[tuple[str, bytes]]


class TopicPartition(NamedTuple):
    """A partition of a topic. A tuple, so hashing it (per record, in the in-flight ledger) runs in C."""

    topic: str
    partition: int


@dataclass(slots=True)
class InputRecord:
    """One consumed record, as it came off the wire, plus where it came from."""

    value: bytes | None
    key: bytes | None
    headers: Headers
    tp: TopicPartition
    offset: int
    timestamp_ms: int | None  # broker / producer timestamp, when the record has one
    received_s: float  # monotonic clock when the operator polled it
    trace: Any = None  # whatever the observer (tracing) keeps for this record


@dataclass(slots=True)
class Pending:
    """A decoded record waiting in the batcher or in the engine.

    ``document`` is the decoded record (a JSON object for the json codec, the text for raw);
    ``item`` is what the engine's ``prepare`` made of the model input.
    """

    record: InputRecord
    document: Any
    item: Any


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One record to produce: to an output topic or, with error headers, to the dead-letter topic."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers


def message_bytes(value: bytes | None, key: bytes | None, headers: Headers) -> int:
    """Bytes of a record's value, key and headers: what counts against a topic's ``max.message.bytes``
    (less the record's own framing, which the sink's limits already leave room for)."""
    return len(value or b"") + len(key or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def names(tps: Iterable[TopicPartition]) -> str:
    """``topic[partition], ...`` in order, for logs and messages."""
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))
