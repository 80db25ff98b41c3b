"""KafkaSource.rewind, which exactly-once uses after an aborted transaction: back to the committed offsets, and
where the group has committed nothing yet, back to where this assignment started reading."""

from __future__ import annotations

import time

import pytest

from sluice.config import KafkaSource as KafkaSourceConfig
from sluice.connectors.kafka import KafkaSource
from sluice.operator.record import InputRecord, TopicPartition
from tests.support.kafka import create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka


def poll_until(source: KafkaSource, count: int, timeout_s: float = 30) -> list[InputRecord]:
    records: list[InputRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records += source.poll(100, 0.1)
    return records


@pytest.mark.parametrize("offset_reset", ["earliest", "latest"])
def test_a_rewind_with_nothing_committed_rereads_what_this_assignment_read(kafka_bootstrap: str,
                                                                          offset_reset: str) -> None:
    topic = unique_topic("rewind")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(f"old{i}", "before the start") for i in range(3)])
    cfg = KafkaSourceConfig(bootstrap_servers=kafka_bootstrap, topics=[topic], group_id=unique_topic("g"),
                            auto_offset_reset=offset_reset)
    source = KafkaSource(cfg, commit_interval_ms=100, transactional=True)  # commits nothing by itself
    try:
        assigned: list[TopicPartition] = []
        source.subscribe(assigned.extend, lambda tps: None, lambda tps: None)
        deadline = time.monotonic() + 30
        while not assigned and time.monotonic() < deadline:
            source.poll(100, 0.1)
        assert assigned, "no assignment within 30 s"
        first = poll_until(source, 3, timeout_s=3)  # latest: positions at the end, nothing yet
        produce(kafka_bootstrap, topic, [(f"new{i}", "after the start") for i in range(5)])
        expected = 8 if offset_reset == "earliest" else 5
        first += poll_until(source, expected - len(first))
        assert len(first) == expected
        source.rewind(source.assignment)
        again = poll_until(source, expected)
        assert [r.offset for r in again] == [r.offset for r in first]  # not the partition's end ("latest")
    finally:
        source.close()
