"""An in-memory source and sink for running the real :class:`Runner` without a broker.

They keep the contracts the runner relies on (delivery reports served on ``poll`` / ``flush`` by the thread
that calls them, offsets stored and committed per partition) and record everything, so a test can check
that each input ended in the output or the dead-letter topic exactly once, and what was committed.
Kafka itself is covered by the tests on the real broker; this harness is for thousands of hostile records
in a second.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.config import LoadedPipeline, parse_pipeline
from sluice.engines.base import BatchEngine, ContinuousEngine
from sluice.operator.observer import Observer
from sluice.operator.record import Headers, InputRecord, TopicPartition
from sluice.operator.runner import Runner, RunSummary

TOPIC = "in"
PIPELINE = """
source: {kafka: {bootstrap_servers: "memory:0", topics: [in], group_id: g}}
codec: {format: json, input_field: text, max_record_bytes: 200000, max_depth: 32}
batching: {max_batch_size: 16, max_queue_delay_ms: 1, bucket_by: tokens}  # tokens: item_length is asked
engine: {type: python, function: "unused:unused"}
sink: {kafka: {topic: out}, output: {mode: merge, field: tagged}}
dead_letter: {topic: dlq, max_consecutive_failures: %s}
runtime: {max_in_flight: 1000, commit_interval_ms: 10, drain_timeout_s: 30}
"""


def pipeline(max_consecutive_failures: int | None = None, extra: str = "") -> LoadedPipeline:
    """The harness pipeline (codec bounds small enough to reach in a test), with ``extra`` YAML appended."""
    threshold = "null" if max_consecutive_failures is None else str(max_consecutive_failures)
    return parse_pipeline(PIPELINE % threshold + extra, environ={})


class MemorySource:
    """Hands out ``records`` (value, key, headers) from one partition of ``in``, in order."""

    def __init__(self, records: Sequence[tuple[bytes | None, bytes | None, Headers]]) -> None:
        self.tp = TopicPartition(TOPIC, 0)
        self._records = list(records)
        self._next = 0
        self.assignment: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.committed: dict[TopicPartition, int] = {}

    def subscribe(self, on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.assignment = {self.tp}
        on_assign([self.tp])

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        if self.tp in self.paused:
            return []
        batch = self._records[self._next:self._next + max_records]
        out = [InputRecord(value, key, list(headers), self.tp, self._next + i, None, 0.0)
               for i, (value, key, headers) in enumerate(batch)]
        self._next += len(out)
        return out

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        self.committed.update(watermarks)

    def commit(self, watermarks: dict[TopicPartition, int]) -> None:
        self.committed.update(watermarks)

    def pause(self, tps: Any) -> None:
        self.paused.update(tps)

    def resume(self, tps: Any) -> None:
        self.paused.difference_update(tps)

    def lag(self) -> dict[TopicPartition, int]:
        return {}

    @property
    def paused_partitions(self) -> set[TopicPartition]:
        return self.paused

    def close(self) -> None:
        pass


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str:
        return dict(self.headers)[name].decode()


class _Message:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


@dataclass
class MemorySink:
    """Keeps what is produced; delivery reports (all successful) come on the next ``poll`` or ``flush``."""

    limits: dict[str, int] = field(default_factory=dict)  # topic -> max message bytes (default 1 MB)
    produced: list[Produced] = field(default_factory=list)
    _reports: list[tuple[Callable[..., None], str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]],
                on_delivery: Any) -> None:
        size = len(value or b"") + len(key or b"") + sum(len(k) + len(v or b"") for k, v in headers)
        assert size <= self.max_message_bytes(topic), f"a {size}-byte record produced to {topic}"
        with self._lock:
            self.produced.append(Produced(topic, value, key, list(headers)))
            self._reports.append((on_delivery, topic))

    def poll(self, timeout_s: float = 0) -> int:
        with self._lock:
            reports, self._reports = self._reports, []
        for callback, topic in reports:
            callback(None, _Message(topic))
        return len(reports)

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def max_message_bytes(self, topic: str) -> int:
        return self.limits.get(topic, 1_000_000)

    def on(self, topic: str) -> list[Produced]:
        return [p for p in self.produced if p.topic == topic]


def run(records: Sequence[tuple[bytes | None, bytes | None, Headers]], engine: BatchEngine | ContinuousEngine,
        loaded: LoadedPipeline | None = None, sink: MemorySink | None = None,
        observer: Observer | None = None) -> tuple[RunSummary, MemorySource, MemorySink]:
    """Run the real runner over ``records`` until all are consumed and drained; the engine is started here."""
    source, sink = MemorySource(records), sink or MemorySink()
    engine.start()
    runner = Runner(loaded or pipeline(), source, sink, engine, max_records=len(records), observer=observer)
    summary = runner.run()
    return summary, source, sink
