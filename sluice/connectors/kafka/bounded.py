"""``sluice run --until-end``: the Kafka source read up to the end offsets its partitions had when assigned.

A backfill or a nightly re-index as a bounded job (a Kubernetes Job, deploy/k8s/job.yaml): at each
assignment the end offsets of the new partitions are taken (end_offsets.py says which offsets and why);
records at or past them are dropped unprocessed and their partition is paused, so records produced after
the run began are left for the next run. Once every assigned partition is read to its end, the source is
*exhausted*: the runner finishes what is in flight, commits (the at-least-once commit or the last
transaction) and exits 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from sluice.connectors.kafka.end_offsets import EndOffsets
from sluice.connectors.kafka.kafka_source import KafkaSource
from sluice.operator.ports import PartitionsCallback, SourceFailed
from sluice.operator.record import InputRecord, TopicPartition, names

log = logging.getLogger(__name__)

_QUERY_TIMEOUT_S = 10.0
_QUERY_ATTEMPTS = 3


class BoundedKafkaSource(KafkaSource):
    """A :class:`KafkaSource` that ends. Intake thread only, as its base."""

    bounded = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ends = EndOffsets()

    def subscribe(self, on_assign: PartitionsCallback, on_revoke: PartitionsCallback,
                  on_lost: PartitionsCallback) -> None:
        def assigned(tps: list[TopicPartition]) -> None:
            self.ends.assign(self._ranges(tps))
            done = [tp for tp in tps if self.ends.is_done(tp)]
            if done:
                log.info("--until-end: %s already read to the end", names(done))
            on_assign(tps)
            self._pause_done(done)

        def revoked(tps: list[TopicPartition]) -> None:
            on_revoke(tps)
            self.ends.forget(tps)

        def lost(tps: list[TopicPartition]) -> None:
            on_lost(tps)
            self.ends.forget(tps)

        super().subscribe(assigned, revoked, lost)

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        records = super().poll(max_records, timeout_s)
        ends = self.ends
        last = {r.tp: r.offset for r in records}  # per partition its last offset (records come in order)
        beyond = {tp: end for tp, off in last.items() if (end := ends.end_of(tp)) is not None and off >= end}
        if beyond:  # produced after the run took its end offsets: dropped before they are tracked
            records = [r for r in records if r.offset < beyond.get(r.tp, r.offset + 1)]
        finished = [tp for tp, off in last.items() if ends.advance(tp, off + 1)]
        self._advance_positions(finished)
        self._pause_done(finished)
        return records

    def _advance_positions(self, finished: list[TopicPartition]) -> None:
        """The consumer's own positions: past transaction markers, which never come as records."""
        undone = self.ends.undone()
        if not undone:
            return
        try:
            positions = self._consumer.position([KafkaTopicPartition(tp.topic, tp.partition) for tp in undone])
        except KafkaException as err:
            log.debug("position() failed: %s", err)
            return
        for part in positions:
            tp = TopicPartition(part.topic, part.partition)
            if part.offset >= 0 and self.ends.advance(tp, part.offset):
                finished.append(tp)

    def _pause_done(self, tps: Iterable[TopicPartition]) -> None:
        tps = [tp for tp in set(tps) if tp in self.assignment]
        if tps:
            log.info("--until-end: %s read to the end offsets taken at assignment", names(tps))
            super().pause(tps)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        super().resume([tp for tp in tps if not self.ends.is_done(tp)])  # a done partition stays paused

    def rewind(self, tps: Iterable[TopicPartition]) -> None:
        tps = list(tps)
        super().rewind(tps)
        self.ends.rewound(tps)
        super().resume(tps)  # read again up to the ends

    def lag(self) -> dict[TopicPartition, int]:
        """Records left to read up to the end offsets, per assigned partition."""
        return {tp: n for tp, n in self.ends.remaining().items() if tp in self.assignment}

    def is_exhausted(self) -> bool:
        return self.ends.all_done()

    def _ranges(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(start, end) of each partition: start at the group's committed offset (or where auto_offset_reset
        sends a partition without one), end at the high watermark (read_committed: the last stable offset).
        Raises SourceFailed when the brokers do not answer: a bounded run must know where it ends."""
        if not tps:
            return {}
        parts = [KafkaTopicPartition(tp.topic, tp.partition) for tp in tps]
        for attempt in range(_QUERY_ATTEMPTS):
            try:
                committed = {(p.topic, p.partition): p.offset
                             for p in self._consumer.committed(parts, timeout=_QUERY_TIMEOUT_S)}
                ranges = {}
                for tp in tps:
                    low, high = self._consumer.get_watermark_offsets(
                        KafkaTopicPartition(tp.topic, tp.partition), timeout=_QUERY_TIMEOUT_S, cached=False)
                    start = committed.get((tp.topic, tp.partition), -1)
                    if start < 0:  # nothing committed yet: where auto_offset_reset starts the consumer
                        start = low if self.cfg.auto_offset_reset == "earliest" else high
                    ranges[tp] = (max(start, low), high)
                log.info("--until-end: %s", ", ".join(f"{tp.topic}[{tp.partition}] {s}..{e}"
                                                      for tp, (s, e) in sorted(ranges.items())))
                return ranges
            except KafkaException as err:
                last = err.args[0].str() if err.args else str(err)
                log.warning("--until-end: cannot read the end offsets of %s (%s)%s", names(tps), last,
                            "; retrying" if attempt + 1 < _QUERY_ATTEMPTS else "")
        raise SourceFailed(f"--until-end: the brokers did not tell the end offsets of {names(tps)} ({last}); "
                           "a bounded run must know where it ends: check that the brokers are reachable, then "
                           "run again (nothing past the committed offsets was processed)")
