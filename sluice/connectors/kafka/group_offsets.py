"""Reading a group's committed offsets through a coordinator that may be moving.

After an aborted transaction the exactly-once run seeks back to what its group committed. A broker fault
moves group coordinators, and for some seconds the answer is "not coordinator" or "coordinator loading" --
seen when a partition leader was cut off from its followers (tests/reliability/test_network_faults.py).
Those are waited out with backoff, up to a deadline; any other error is raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

log = logging.getLogger(__name__)

# The coordinator is moving or loading, or a request timed out: asking again later can succeed.
_PASSING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT,
            KafkaError._TRANSPORT, KafkaError._WAIT_COORD}


def committed_offsets(consumer: Any, parts: list[KafkaTopicPartition], timeout_s: float = 120.0,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> list[KafkaTopicPartition]:
    """The group's committed offset of each of ``parts`` (negative where none is committed). Errors that a
    moving coordinator passes through are retried with backoff for up to ``timeout_s``; raises KafkaException
    with the last error after that, or at once for any other error."""
    deadline, delay = clock() + timeout_s, 0.2
    while True:
        try:
            found = consumer.committed(parts, timeout=max(1.0, min(30.0, deadline - clock())))
            err = next((p.error for p in found if p.error is not None), None)
            if err is None:
                return list(found)
        except KafkaException as exc:
            err = exc.args[0]
        if not (err.retriable() or err.code() in _PASSING) or clock() + delay > deadline:
            raise KafkaException(err)
        log.info("reading the committed offsets: %s; asking again in %.1f s", err.str(), delay)
        sleep(delay)
        delay = min(2 * delay, 5.0)
