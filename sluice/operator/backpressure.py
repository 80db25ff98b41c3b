"""Backpressure: at most ``runtime.max_in_flight`` records between poll and delivery, shared fairly.

Each assigned partition may hold up to its share (``max_in_flight`` / partitions) of records in flight, and
all of them together ``max_in_flight``. Pausing only the partitions over their share matters: librdkafka
hands out each fetch partition by partition, so with all partitions paused and resumed together the one
served first in every fetch crowds the others out (seen: a partition that got no record at all). A paused
partition keeps being polled for (so the group never evicts it) and resumes below half its share, once the
total is below the low mark.

Pausing happens between polls, so one poll must not take more than a partition has room for: a fetch
response holds thousands of records of one partition, and a poll of the whole free window would hand all of
it to whichever partition librdkafka queued first -- after every resume the same one (seen: two partitions
sharing all output, the third none, under load). So near the shares a poll is capped at the room the
fullest unpaused partition has left (at least a quarter share, so polls do not shrink to one record):
no partition holds more than 1.25 times its share, and the others get the rest of the window. The runner
applies the pauses again right after each poll, before delivery reports free room: otherwise a partition
each poll fills to its share is back under it by the next pass and is never paused. Intake thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluice.operator.ports import Source
from sluice.operator.record import TopicPartition, names
from sluice.operator.state import SharedState

log = logging.getLogger(__name__)


class Backpressure:
    """Pauses and resumes the source's partitions by the ledger's counts."""

    def __init__(self, max_in_flight: int, poll_batch: int, state: SharedState, source: Source,
                 is_stalled: Callable[[TopicPartition], bool]) -> None:
        self.max_in_flight, self.poll_batch = max_in_flight, poll_batch
        self._resume_below = max(1, max_in_flight // 2)
        self.state, self.source, self.is_stalled = state, source, is_stalled

    def poll_limit(self, records_left: int | None) -> int:
        """How many records the next poll may take: never past the in-flight bound (a poll of up to
        ``poll_batch`` would overshoot it) nor past ``records_left`` (``--max-records``), and near the
        partitions' shares not past the room of the fullest partition still fetching (see the module)."""
        total = self.state.ledger.num_in_flight
        limit = self.poll_batch if records_left is None else min(self.poll_batch, records_left)
        limit = min(limit, max(1, self.max_in_flight - total))
        if not self.source.assignment:
            return limit
        share = self._share()
        if total + limit <= share:
            return limit  # no partition can pass its share in this poll: the common case
        ledger, paused = self.state.ledger, self.source.paused_partitions
        fullest = max((ledger.num_in_flight_of(tp) for tp in self.source.assignment if tp not in paused), default=0)
        return min(limit, max(share - fullest, share // 4, 1))

    def apply(self) -> None:
        """Pause the partitions over their share; resume those with room again."""
        ledger, source = self.state.ledger, self.source
        total, paused = ledger.num_in_flight, source.paused_partitions
        if not source.assignment or (not paused and total < self.max_in_flight // len(source.assignment)):
            return  # nothing can be over its share: the common case costs two lookups
        share = self._share()
        over_total = total >= self.max_in_flight
        to_pause, to_resume = [], []
        for tp in source.assignment:
            num = ledger.num_in_flight_of(tp)
            if tp in paused:
                if self.is_stalled(tp):
                    continue  # waits for the schema registry, not for room
                if not over_total and num <= share // 2 and total <= self._resume_below:
                    to_resume.append(tp)
            elif over_total or num >= share:
                to_pause.append(tp)
        if to_pause:
            source.pause(to_pause)
            log.debug("paused %s: %d records in flight", names(to_pause), total)
        if to_resume:
            source.resume(to_resume)
            log.debug("resumed %s: %d records in flight", names(to_resume), total)

    def _share(self) -> int:
        """Each assigned partition's share of the in-flight bound (partitions assigned: at least one)."""
        return max(1, self.max_in_flight // len(self.source.assignment))

    def assigned(self, tps: list[TopicPartition]) -> None:
        """A rebalance must not undo backpressure: new partitions start paused while over the bound."""
        if self.state.ledger.num_in_flight >= self.max_in_flight:
            self.source.pause(tps)
