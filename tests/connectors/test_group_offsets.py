"""committed_offsets: a moving group coordinator is waited out; any other error is raised at once."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from sluice.connectors.kafka.group_offsets import committed_offsets
from sluice.testing.memory_kafka import ManualClock


class _Consumer:
    """Answers ``committed`` with each of ``answers`` in turn: an error code (raised), or offsets."""

    def __init__(self, *answers: int | list[int]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def committed(self, parts: list[KafkaTopicPartition], timeout: float) -> list[KafkaTopicPartition]:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return [KafkaTopicPartition(p.topic, p.partition, off) for p, off in zip(parts, answer, strict=True)]


def _read(consumer: Any, timeout_s: float = 120.0) -> tuple[list[int], float]:
    clock = ManualClock(0.0)
    found = committed_offsets(consumer, [KafkaTopicPartition("in", 0), KafkaTopicPartition("in", 1)], timeout_s,
                              clock=clock, sleep=clock.advance)
    return [p.offset for p in found], clock()


def test_a_moving_coordinator_is_waited_out_with_backoff() -> None:
    consumer = _Consumer(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, [7, -1001])
    offsets, waited = _read(consumer)
    assert offsets == [7, -1001] and consumer.calls == 3
    assert waited == pytest.approx(0.2 + 0.4)


def test_other_errors_and_a_coordinator_that_never_comes_back_are_raised() -> None:
    with pytest.raises(KafkaException) as refused:
        _read(_Consumer(KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as gone:
        _read(_Consumer(*[KafkaError.NOT_COORDINATOR] * 100), timeout_s=10)
    assert gone.value.args[0].code() == KafkaError.NOT_COORDINATOR
