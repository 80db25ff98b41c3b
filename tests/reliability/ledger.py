"""Sequenced input records and the count of what came out of them, read with independent clients.

Every input carries ``{"seq": i, "text": ...}``. An output (merge mode) keeps the input's fields, and a
dead-letter record is the input's own bytes, so each record read back names the input it came from.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.support.kafka import ConsumedRecord, consume_all, end_offsets, unique_topic


def sequenced(num_records: int, poison: Iterable[int] = ()) -> list[tuple[str, str]]:
    """(key, value) for inputs 0..n-1; inputs in ``poison`` make the engine raise (paced_tag)."""
    bad = set(poison)
    return [(f"k{i}", json.dumps({"seq": i, "text": f"poison {i}" if i in bad else f"record {i}"}))
            for i in range(num_records)]


@dataclass
class Tally:
    """How many times each input appeared in the output and in the dead-letter topic."""

    outputs: list[ConsumedRecord]
    dead: list[ConsumedRecord]
    out_counts: Counter[int] = field(default_factory=Counter)
    dead_counts: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for rec in self.outputs:
            doc = json.loads(rec.value or b"")
            assert doc["tagged"] == f"<{doc['text'].upper()}>", f"wrong output {doc}"
            self.out_counts[doc["seq"]] += 1
        for rec in self.dead:
            self.dead_counts[json.loads(rec.value or b"")["seq"]] += 1

    def missing(self, num_records: int) -> list[int]:
        """Inputs that appear nowhere."""
        return [i for i in range(num_records) if not self.out_counts[i] and not self.dead_counts[i]]

    @property
    def num_duplicates(self) -> int:
        """Copies beyond the first, over outputs and dead-letter records together."""
        return sum(c - 1 for c in (self.out_counts + self.dead_counts).values() if c > 1)


def read_tally(bootstrap: str, t_out: str, t_dlq: str, *, isolation: str = "read_uncommitted",
               min_records: int | None = None, timeout_s: float = 60) -> Tally:
    """Read both topics to their end (the last stable offset for read_committed)."""
    outputs = consume_all(bootstrap, t_out, isolation=isolation, timeout_s=timeout_s)
    dead = consume_all(bootstrap, t_dlq, isolation=isolation, timeout_s=timeout_s)
    if min_records is not None and len(outputs) + len(dead) < min_records:
        raise AssertionError(f"{len(outputs)} outputs + {len(dead)} dead-letter records < {min_records} inputs")
    return Tally(outputs, dead)


def open_transaction_partitions(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Partitions whose last stable offset is below the high watermark -- an open transaction holds them --
    as {partition: (last stable offset, high watermark)}; empty when every transaction is settled."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = [TopicPartition(topic, p) for p in end_offsets(bootstrap, topic)]

    def latest(isolation: IsolationLevel) -> dict[int, int]:
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts}, isolation_level=isolation,
                                     request_timeout=30)
        return {tp.partition: fut.result().offset for tp, fut in futures.items()}

    stable, high = latest(IsolationLevel.READ_COMMITTED), latest(IsolationLevel.READ_UNCOMMITTED)
    return {p: (stable[p], high[p]) for p in high if stable[p] != high[p]}


class Progress:
    """Sum of the end offsets of some topics, with one long-lived client (cheap to poll often): the last
    stable offsets (committed records), or with ``isolation="read_uncommitted"`` the high watermarks."""

    def __init__(self, bootstrap: str, *topics: str, isolation: str = "read_committed") -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("progress"),
                                   "isolation.level": isolation})
        self._parts = [TopicPartition(t, p) for t in topics for p in end_offsets(bootstrap, t)]

    def count(self) -> int:
        return sum(self._consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in self._parts)

    def close(self) -> None:
        self._consumer.close()


def timestamps_ms(bootstrap: str, topic: str, timeout_s: float = 60) -> list[int]:
    """The producer timestamp (CreateTime, ms) of every record of ``topic``, read to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("stamps"),
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        ends = end_offsets(bootstrap, topic)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        left = {p for p, end in ends.items() if end > 0}
        stamps: list[int] = []
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"timestamps of {topic!r}: partitions {sorted(left)} not read in {timeout_s}s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"timestamps of {topic!r}: {err}")
            if err is None:
                stamps.append(msg.timestamp()[1])
            if cast(int, msg.offset()) + 1 >= ends[cast(int, msg.partition())] or err is not None:
                left.discard(cast(int, msg.partition()))
        return stamps
    finally:
        consumer.close()


def throughput_per_s(stamps_ms: list[int]) -> float:
    """Records per second between the first and the last timestamp."""
    stamps = sorted(stamps_ms)
    if len(stamps) < 2 or stamps[-1] == stamps[0]:
        raise AssertionError(f"cannot measure a rate from {len(stamps)} records")
    return (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1000)
