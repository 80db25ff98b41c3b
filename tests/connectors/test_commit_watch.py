"""CommitWatch: since when stored offsets have run ahead of what the group committed (the commit half of the
delivery brake, sluice/operator/backpressure.py)."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError

from sluice.connectors.kafka.commit_watch import CommitWatch
from sluice.operator.record import TopicPartition
from sluice.testing.memory_kafka import ManualClock

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


def _part(tp: TopicPartition, offset: int, error: KafkaError | None = None) -> SimpleNamespace:
    return SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset, error=error)


def test_the_gap_opens_on_a_store_and_closes_only_once_every_partition_is_committed_that_far() -> None:
    clock = ManualClock(10.0)
    watch = CommitWatch(clock)
    watch.stored({A: 5, B: 7})
    assert watch.since == 10.0
    clock.advance(1)
    watch.on_commit(None, [_part(A, 5)])
    assert watch.since == 10.0  # B still waits
    watch.stored({A: 9})  # a later store does not restart the clock while the gap is open
    watch.on_commit(None, [_part(A, 9), _part(B, 7)])
    assert watch.since is None
    clock.advance(1)
    watch.stored({A: 9, B: 7})  # nothing new: no gap
    assert watch.since is None
    watch.stored({B: 8})
    assert watch.since == 12.0


def test_failed_commits_keep_the_gap_open_and_a_partition_that_leaves_closes_its_part() -> None:
    clock = ManualClock(0.0)
    watch = CommitWatch(clock)
    watch.stored({A: 3, B: 4})
    watch.on_commit(KafkaError(KafkaError.REQUEST_TIMED_OUT), [_part(A, 3), _part(B, 4)])
    watch.on_commit(None, [_part(A, 3, KafkaError(KafkaError.NOT_COORDINATOR)), _part(B, 4)])
    assert watch.since == 0.0  # A's commit failed
    watch.forget([A])  # lost: its offsets are its next owner's business now
    assert watch.since is None


def test_nothing_to_commit_is_no_failure() -> None:
    watch = CommitWatch(ManualClock())
    watch.on_commit(KafkaError(KafkaError._NO_OFFSET), [])
    assert watch.since is None
