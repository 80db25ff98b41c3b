"""A Kafka source and sink in memory, for running the real :class:`~sluice.operator.runner.Runner` without a broker.

They keep the runner's contracts (sluice/operator/ports.py) -- delivery reports served on ``poll`` / ``flush`` by
the calling thread, offsets stored and committed per partition, rebalance callbacks from within ``poll``,
transactions whose outputs and offsets commit or abort together -- and record everything in one ordered event log:
a test checks that each input ended in the output or the dead-letter topic exactly once, what was committed, and in
which order. Thousands of records a second, no broker.

Time may be a :class:`ManualClock`: an empty poll moves it on by its timeout, one with records by ``poll_s``:
commit intervals, transaction intervals and batch deadlines pass by polls, not by wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from sluice.operator.record import Headers, InputRecord, TopicPartition


class ManualClock:
    """A monotonic clock that moves only when told to (thread-safe)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class EventLog:
    """What happened, in order, across threads: (kind, detail) pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, detail: Any) -> None:
        with self._lock:
            self.events.append((kind, detail))

    def of(self, kind: str) -> list[Any]:
        with self._lock:
            return [d for k, d in self.events if k == kind]


class MemorySource:
    """Hands out ``records`` (value, key, headers) from partition 0 of ``topic``, in order.

    ``per_poll`` caps each poll; ``script(source)`` runs at the start of every poll (a test triggers a
    revoke, a loss or a stop from there, as librdkafka calls back from within poll). ``bounded``: the source
    ends after its records (the run finishes what is in flight, then stops), as a bounded Kafka run does."""

    def __init__(self, records: Sequence[tuple[bytes | None, bytes | None, Headers]], *, per_poll: int = 10_000,
                 clock: ManualClock | None = None, poll_s: float = 0.002, log: EventLog | None = None,
                 script: Callable[[MemorySource], None] | None = None, topic: str = "in", bounded: bool = False) -> None:
        self.bounded = bounded
        self.tp = TopicPartition(topic, 0)
        self._records = list(records)
        self._next = 0
        self.per_poll, self.clock, self.poll_s, self.log, self.script = per_poll, clock, poll_s, log or EventLog(), script
        self.assignment: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.committed: dict[TopicPartition, int] = {}  # the group's committed offsets
        self.stored: dict[TopicPartition, int] = {}
        self._callbacks: tuple[Any, Any, Any] | None = None

    @property
    def num_handed_out(self) -> int:
        return self._next

    def subscribe(self, on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self._callbacks = (on_assign, on_revoke, on_lost)
        self.assign()

    def assign(self) -> None:
        """(Re)assign the partition; reading resumes at the committed offset, as for a new owner."""
        assert self._callbacks is not None
        self.assignment = {self.tp}
        self._next = self.committed.get(self.tp, 0)
        self.log.add("assign", self._next)
        self._callbacks[0]([self.tp])

    def revoke(self) -> None:
        """The revoke callback (work for the partition may still be committed), then the partition goes."""
        assert self._callbacks is not None
        self.log.add("revoke", self.tp)
        self._callbacks[1]([self.tp])
        self.assignment.discard(self.tp)
        self.paused.discard(self.tp)

    def lose(self) -> None:
        """The partition is gone already (a session timeout), then the lost callback."""
        assert self._callbacks is not None
        self.assignment.discard(self.tp)
        self.paused.discard(self.tp)
        self.log.add("lost", self.tp)
        self._callbacks[2]([self.tp])

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        if self.script is not None:
            self.script(self)
        if self.tp in self.paused or self.tp not in self.assignment or self._next >= len(self._records):
            if self.clock is not None:
                self.clock.advance(timeout_s)  # an empty poll waits its timeout
            return []
        batch = self._records[self._next:self._next + min(max_records, self.per_poll)]
        now = 0.0
        if self.clock is not None:
            self.clock.advance(self.poll_s)
            now = self.clock()
            time.sleep(0.0005)  # a real poll waits on the network: the engine thread gets its turn
        out = [InputRecord(value, key, list(headers), self.tp, self._next + i, None, now)
               for i, (value, key, headers) in enumerate(batch)]
        self._next += len(out)
        return out

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        if watermarks:
            self.log.add("store", dict(watermarks))
        self.stored.update(watermarks)
        self.committed.update(watermarks)  # the periodic commit of what was stored, at once

    def commit(self, watermarks: dict[TopicPartition, int]) -> None:
        if watermarks:
            self.log.add("commit", dict(watermarks))
        self.committed.update(watermarks)

    def pause(self, tps: Any) -> None:
        self.paused.update(tps)

    def resume(self, tps: Any) -> None:
        self.paused.difference_update(tps)

    def lag(self) -> dict[TopicPartition, int]:
        return {}

    def uncommitted_since(self) -> float | None:  # commits take effect at once
        return None

    @property
    def paused_partitions(self) -> set[TopicPartition]:
        return self.paused

    def group_metadata(self) -> Any:
        return "group-metadata"

    def rewind(self, tps: Any) -> None:
        if self.tp in set(tps):
            self._next = self.committed.get(self.tp, 0)
            self.log.add("rewind", self._next)

    def is_exhausted(self) -> bool:
        return self.bounded and self._next >= len(self._records)

    def close(self) -> None:
        self.log.add("close", None)


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str:
        return dict(self.headers)[name].decode()

    @property
    def input_offset(self) -> int:
        """The offset of the input this output (or dead letter) was made from."""
        headers = dict(self.headers)
        return int(headers.get("sluice.source.offset", headers.get("sluice.error.offset", b"-1")))


class _Message:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


class DeliveryError:
    """What librdkafka hands a delivery callback for a record it could not deliver."""

    def __init__(self, code: int = KafkaError.MSG_SIZE_TOO_LARGE, text: str = "Broker: Message size too large"):
        self._code, self._text = code, text

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return self._text


@dataclass
class MemorySink:
    """Keeps what is produced; delivery reports come on the next ``poll`` or ``flush`` -- successful unless
    ``fails(record)`` says otherwise, in produce order or ``reverse``d per poll.

    Transactions: outputs produced inside one are in ``produced`` at once and in ``committed_outputs`` once
    it commits; its offsets go to ``group_offsets`` (give the source's ``committed``). ``commit_errors``
    are raised by the next commits, one each (None: that commit succeeds)."""

    limits: dict[str, int] = field(default_factory=dict)  # topic -> max message bytes (default 1 MB)
    produced: list[Produced] = field(default_factory=list)
    fails: Callable[[Produced], bool] | None = None
    reverse: bool = False
    log: EventLog = field(default_factory=EventLog)
    group_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    commit_errors: list[KafkaException | None] = field(default_factory=list)
    committed_outputs: list[Produced] = field(default_factory=list)
    _open: list[Produced] | None = None  # outputs of the open transaction
    _reports: list[tuple[Callable[..., None], Produced]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]],
                on_delivery: Any) -> None:
        size = len(value or b"") + len(key or b"") + sum(len(k) + len(v or b"") for k, v in headers)
        assert size <= self.max_message_bytes(topic), f"a {size}-byte record produced to {topic}"
        record = Produced(topic, value, key, list(headers))
        with self._lock:
            self.produced.append(record)
            self._reports.append((on_delivery, record))
            if self._open is not None:
                self._open.append(record)

    def poll(self, timeout_s: float = 0) -> int:
        with self._lock:
            reports, self._reports = self._reports, []
        for callback, record in reversed(reports) if self.reverse else reports:
            if self.fails is not None and self.fails(record):
                self.log.add("failed", record.input_offset)
                callback(DeliveryError(), _Message(record.topic))
            else:
                self.log.add("delivered", (record.topic, record.input_offset))
                callback(None, _Message(record.topic))
        return len(reports)

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def num_pending(self) -> int:
        return len(self._reports)

    def max_message_bytes(self, topic: str) -> int:
        return self.limits.get(topic, 1_000_000)

    def on(self, topic: str) -> list[Produced]:
        return [p for p in self.produced if p.topic == topic]

    # --------------------------------------------------------------------------------- transactions
    def init_transactions(self, timeout_s: float = 60) -> None:
        self.log.add("init_transactions", None)

    def begin_transaction(self) -> None:
        self._open = []

    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any, timeout_s: float) -> None:
        assert self._open is not None and group_metadata == "group-metadata"
        with self._lock:
            assert not self._reports, "a transaction commits only after a flush"
        error = self.commit_errors.pop(0) if self.commit_errors else None
        if error is not None:
            raise error
        self.committed_outputs += self._open
        self.group_offsets.update(offsets)
        self.log.add("transaction", dict(offsets))
        self._open = None

    def abort_transaction(self, timeout_s: float) -> None:
        assert self._open is not None
        with self._lock:  # what was not delivered yet is purged
            reports, self._reports = self._reports, []
        for callback, record in reports:
            callback(DeliveryError(KafkaError._PURGE_QUEUE, "purged"), _Message(record.topic))
        self.log.add("abort", len(self._open))
        self._open = None

    def recreate(self) -> None:
        self._open = None


def abortable(text: str = "the coordinator moved") -> KafkaException:
    """A commit failure after which the transaction must be aborted (and its records processed again)."""
    return KafkaException(KafkaError(KafkaError._STATE, text, fatal=False, retriable=False, txn_requires_abort=True))
