"""Which stored offsets the group has not confirmed as committed yet, and since when.

At-least-once stores each partition's watermark and lets librdkafka's auto-commit send it; the commit's
outcome comes back through ``on_commit``. While commits fail -- the group coordinator cut off from its
replicas takes them and never answers, say -- the stored offsets run ahead of the committed ones, and a
rebalance makes the partitions' next owner redo everything in between. :attr:`CommitWatch.since` says how
long that gap has been open; the delivery brake (sluice/operator/backpressure.py) stops taking records
when it is too long. Pure bookkeeping; the intake thread only (stores, commit callbacks and the brake all
run there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError

from sluice.operator.record import TopicPartition

log = logging.getLogger(__name__)


class CommitWatch:
    """Stored offsets against confirmed ones, per partition."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._stored: dict[TopicPartition, int] = {}
        self._confirmed: dict[TopicPartition, int] = {}
        self.since: float | None = None  # when some stored offset first ran ahead of the committed one

    def stored(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets handed to the consumer to commit."""
        self._stored.update(offsets)
        self._update()

    def confirmed(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets the group coordinator has committed (a successful commit's partitions)."""
        for tp, offset in offsets.items():
            if offset > self._confirmed.get(tp, -1):
                self._confirmed[tp] = offset
        self._update()

    def on_commit(self, err: KafkaError | None, parts: list[Any]) -> None:
        """librdkafka's ``on_commit``: the outcome of an (auto-)commit, served from the consumer's poll."""
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            log.debug("offset commit failed: %s", err.str())
            return
        done = {TopicPartition(p.topic, p.partition): p.offset for p in parts if p.error is None and p.offset >= 0}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("offsets committed (%s): %s", err.str() if err is not None else "ok",
                      ", ".join(f"{tp.topic}[{tp.partition}]@{off}" for tp, off in done.items()))
        self.confirmed(done)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions that left this consumer: their commits are no longer this process's to wait for."""
        for tp in tps:
            self._stored.pop(tp, None)
            self._confirmed.pop(tp, None)
        self._update()

    def _update(self) -> None:
        behind = any(offset > self._confirmed.get(tp, -1) for tp, offset in self._stored.items())
        if not behind:
            self.since = None
        elif self.since is None:
            self.since = self._clock()
