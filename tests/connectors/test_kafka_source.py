"""KafkaSource.rewind, which exactly-once uses after an aborted transaction: back to the committed offsets, and
where the group has committed nothing yet, back to where this assignment started reading."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

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


def test_a_static_member_fenced_under_its_own_id_joins_again_and_keeps_consuming(kafka_bootstrap: str) -> None:
    """librdkafka reports FENCED_INSTANCE_ID as fatal even where the fencing registration is the member's own
    (a coordinator failover). Sluice's derived id is held through its host slot lock, so the source replaces
    its consumer: the partitions are lost once, come back, and records flow again. Here another consumer
    takes the id for a moment to make the broker fence the source, then goes away."""
    topic = unique_topic("fenced")
    create_topic(kafka_bootstrap, topic, 2)
    group = unique_topic("g")
    cfg = KafkaSourceConfig(bootstrap_servers=kafka_bootstrap, topics=[topic], group_id=group,
                            config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    source = KafkaSource(cfg, commit_interval_ms=100, group_instance_id=f"{group}-host-0")
    assert source.derived_instance_id
    assigned: list[TopicPartition] = []
    lost: list[TopicPartition] = []
    source.subscribe(assigned.extend, lambda tps: None, lost.extend)
    try:
        produce(kafka_bootstrap, topic, [(f"k{i}", "before") for i in range(20)])
        assert len(poll_until(source, 20)) == 20
        intruder = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group,
                             "group.instance.id": f"{group}-host-0", "session.timeout.ms": 6000,
                             "partition.assignment.strategy": "cooperative-sticky"})
        intruder.subscribe([topic])
        deadline = time.monotonic() + 30
        while not lost and time.monotonic() < deadline:  # the source is fenced by the intruder's join
            intruder.poll(0.1)
            source.poll(100, 0.1)
        intruder.close()
        assert sorted(lost) == sorted(assigned[:2]), "the fenced source lost its partitions once"
        produce(kafka_bootstrap, topic, [(f"k{i}", "after") for i in range(20)])
        after: list[InputRecord] = []  # (the "before" ones come again too: nothing was committed here)
        deadline = time.monotonic() + 60
        while len(after) < 20 and time.monotonic() < deadline:
            after += [r for r in source.poll(100, 0.1) if r.value == b"after"]
        assert len(after) == 20  # the new consumer is a member again, under the same id
    finally:
        source.close()


class _FakeConsumer:
    made: list[_FakeConsumer] = []

    def __init__(self, conf: dict[str, object]) -> None:
        self.conf, self.closed, self.subscribed = conf, False, False
        _FakeConsumer.made.append(self)

    def subscribe(self, topics: list[str], **callbacks: object) -> None:
        self.subscribed = True

    def close(self) -> None:
        self.closed = True


def test_fenced_rejoins_are_bounded_and_only_for_sluices_own_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import KafkaError

    from sluice.connectors.kafka import kafka_source as source_module
    from sluice.operator.ports import SourceFailed

    monkeypatch.setattr(source_module, "Consumer", _FakeConsumer)
    _FakeConsumer.made.clear()
    fenced = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer with same "
                        "group.instance.id", fatal=True)
    now = [0.0]
    cfg = KafkaSourceConfig(bootstrap_servers="127.0.0.1:1", topics=["t"], group_id="g")
    source = KafkaSource(cfg, commit_interval_ms=100, clock=lambda: now[0], group_instance_id="g-host-0")
    lost: list[list[TopicPartition]] = []
    source.subscribe(lambda tps: None, lambda tps: None, lost.append)
    source.assignment.update({TopicPartition("t", 0), TopicPartition("t", 1)})
    for _ in range(3):  # three rejoins within the window: each a new consumer, the old one closed
        source._on_error(fenced)
        now[0] += 10
    assert len(_FakeConsumer.made) == 4 and all(c.closed for c in _FakeConsumer.made[:3])
    assert _FakeConsumer.made[-1].subscribed and len(lost) == 1  # nothing was assigned after the first
    with pytest.raises(SourceFailed, match="group.instance.id"):  # a fourth: another process holds the id
        source._on_error(fenced)
    now[0] += 400  # past the window: a rejoin is allowed again
    source2 = KafkaSource(cfg.model_copy(update={"config": {"group.instance.id": "mine"}}), commit_interval_ms=100,
                          group_instance_id="mine")
    source2.subscribe(lambda tps: None, lambda tps: None, lambda tps: None)
    assert not source2.derived_instance_id
    with pytest.raises(SourceFailed):  # a user's own id: never rejoined behind their back
        source2._on_error(fenced)
