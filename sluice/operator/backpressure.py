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

The delivery brake (at-least-once, ``runtime.brake_after_ms``): while an output has waited longer than that
for its delivery report, or stored offsets for the group to commit them (sluice/connectors/kafka/
commit_watch.py), every partition is paused as if over the bound, and the engine thread starts no new batch
(``SharedState.braked``; the drain lifts it); both go on once deliveries and commits do. A broker cut off
from its replicas still takes requests and never answers them: as a partition leader it would have the
whole in-flight window processed and held in the producer, delivered late; as the group coordinator it
lets no commit through while processing goes on. If the group then moves the partitions, their next owner
redoes all of that. With the brake, a move redoes about ``brake_after_ms`` worth of records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sluice.config import Runtime
from sluice.operator.ports import Source
from sluice.operator.record import TopicPartition, names
from sluice.operator.state import SharedState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryBrake:
    """Pause the run while outputs wait for their acknowledgement, or stored offsets for their commit, longer
    than ``after_s``."""

    undelivered_since: Callable[[], float | None]  # when the oldest output waiting for its report was produced
    uncommitted_since: Callable[[], float | None]  # when stored offsets first ran ahead of the committed ones
    after_s: float
    clock: Callable[[], float]

    def stalled(self) -> str | None:
        """What has waited past ``after_s``, in words (None: nothing has)."""
        now = self.clock()
        for since, what in ((self.undelivered_since(), "an output has waited %.1f s for the brokers to acknowledge it"),
                            (self.uncommitted_since(), "stored offsets have waited %.1f s for the group to commit them")):
            if since is not None and now - since > self.after_s:
                return what % (now - since)
        return None


class Undelivered(Protocol):
    def oldest_undelivered_s(self) -> float | None: ...


def delivery_brake(runtime: Runtime, in_order: bool, outputs: Undelivered, source: Source,
                   clock: Callable[[], float]) -> DeliveryBrake | None:
    """The brake of an at-least-once run (``outputs``: the emitter); none under exactly-once (``in_order``),
    where every transaction commit waits for all deliveries and a move aborts what is not committed; none
    where ``runtime.brake_after_ms`` is 0."""
    after_ms = 3 * runtime.commit_interval_ms if runtime.brake_after_ms is None else runtime.brake_after_ms
    if in_order or after_ms == 0:
        return None
    return DeliveryBrake(outputs.oldest_undelivered_s, source.uncommitted_since, after_ms / 1000, clock)


class Backpressure:
    """Pauses and resumes the source's partitions by the ledger's counts (and the delivery brake)."""

    def __init__(self, max_in_flight: int, poll_batch: int, state: SharedState, source: Source,
                 is_stalled: Callable[[TopicPartition], bool], brake: DeliveryBrake | None = None) -> None:
        self.max_in_flight, self.poll_batch = max_in_flight, poll_batch
        self._resume_below = max(1, max_in_flight // 2)
        self.state, self.source, self.is_stalled = state, source, is_stalled
        self.brake, self._braked = brake, False

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
        braked = self._brake_engaged()
        if not source.assignment or (not paused and not braked
                                     and total < self.max_in_flight // len(source.assignment)):
            return  # nothing can be over its share and the brake is off: the common case, a few lookups
        share = self._share()
        over_total = braked or total >= self.max_in_flight
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

    def _brake_engaged(self) -> bool:
        stalled = None if self.brake is None else self.brake.stalled()
        if (stalled is not None) != self._braked:
            self._braked = stalled is not None
            with self.state.cond:  # the engine thread starts no new batch either while braked
                self.state.braked = self._braked and not self.state.draining
                self.state.cond.notify_all()
            if stalled is not None:
                log.warning("%s: taking and processing no new records until it moves (runtime.brake_after_ms)",
                            stalled)
            else:
                log.info("deliveries and commits flow again: taking new records")
        return self._braked

    def _share(self) -> int:
        """Each assigned partition's share of the in-flight bound (partitions assigned: at least one)."""
        return max(1, self.max_in_flight // len(self.source.assignment))

    def assigned(self, tps: list[TopicPartition]) -> None:
        """A rebalance must not undo backpressure: new partitions start paused while over the bound."""
        if self.state.ledger.num_in_flight >= self.max_in_flight or self._braked:
            self.source.pause(tps)
