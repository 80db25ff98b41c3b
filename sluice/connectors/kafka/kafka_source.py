"""The Kafka source: a cooperative-sticky consumer on confluent-kafka (librdkafka), the operator's
:class:`~sluice.operator.ports.Source`.

Offsets are *stored* only by the operator, from the in-flight ledger's watermark, and committed by
librdkafka's auto-commit (or synchronously on revoke and shutdown) -- or, under exactly-once, only inside the
producer's transactions, never by this consumer. All methods run on the operator's intake thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from sluice.config import KafkaSource as KafkaSourceConfig
from sluice.connectors.kafka.commit_watch import CommitWatch
from sluice.connectors.kafka.connectivity import ConnectivityLog, is_connectivity
from sluice.connectors.kafka.consumer_config import consumer_config
from sluice.connectors.kafka.fencing import RejoinBudget, fatal_hint, is_fenced_instance
from sluice.connectors.kafka.group_offsets import committed_offsets
from sluice.connectors.kafka.statistics import read_statistics
from sluice.operator.ports import PartitionsCallback, SourceFailed
from sluice.operator.record import InputRecord, TopicPartition

log = logging.getLogger(__name__)

_LEAVE_TIMEOUT_S = 10.0  # how long a static member's close waits for its revoke before closing anyway


class KafkaSource:
    """Consumes the pipeline's topics. All methods are called from the operator's intake thread."""

    bounded = False  # runs until stopped; --until-end reads up to the end offsets instead (bounded.py)

    def __init__(self, cfg: KafkaSourceConfig, commit_interval_ms: int, clock: Callable[[], float] = time.monotonic,
                 transactional: bool = False, group_instance_id: str | None = None) -> None:
        """``transactional``: offsets are committed only through the producer's transactions
        (exactly-once), never by this consumer, and only committed input records are read.
        ``group_instance_id``: static group membership (a ``group.instance.id`` in ``cfg.config`` wins)."""
        self.cfg = cfg
        self._clock = clock
        self._connectivity = ConnectivityLog("kafka consumer", log, clock)
        self.transactional = transactional
        self.commits = CommitWatch(clock)  # stored offsets the group has not committed yet (at-least-once)
        conf = consumer_config(cfg, commit_interval_ms, transactional, group_instance_id, self._on_stats,
                               None if transactional else self.commits.on_commit)
        self._conf = conf
        self._consumer = Consumer(conf)
        self._callbacks: tuple[PartitionsCallback, PartitionsCallback, PartitionsCallback] | None = None
        self._rejoins = RejoinBudget()  # a member fenced under its own id joins again, a few times (fencing.py)
        member = conf.get("group.instance.id")
        self.group_instance_id = None if member is None else str(member)
        # Sluice's own id, from this host's instance slot lock (sluice/operator/instance.py), not the user's
        self.derived_instance_id = group_instance_id is not None and "group.instance.id" not in cfg.config
        self._failed = False  # a fatal error: the consumer cannot leave the group any more
        self._paused: set[TopicPartition] = set()
        self.assignment: set[TopicPartition] = set()
        self._tps: dict[tuple[str, int], TopicPartition] = {}  # one object per partition, not per record
        self._lag: dict[TopicPartition, int] = {}
        self._next_offset: dict[TopicPartition, int] = {}  # per assigned partition: the next offset to expect
        # per assigned partition: the first offset consumed since it was assigned (where a rewind goes when
        # the group has committed nothing for it yet)
        self._first_offset: dict[TopicPartition, int] = {}
        self.num_redelivered_dropped = 0

    def subscribe(self, on_assign: PartitionsCallback, on_revoke: PartitionsCallback,
                  on_lost: PartitionsCallback) -> None:
        self._callbacks = (on_assign, on_revoke, on_lost)
        self._subscribe()

    def _subscribe(self) -> None:
        assert self._callbacks is not None
        on_assign, on_revoke, on_lost = self._callbacks

        def assigned(_: Consumer, parts: list[KafkaTopicPartition]) -> None:
            tps = [TopicPartition(p.topic, p.partition) for p in parts]
            self.assignment.update(tps)
            self._forget_positions(tps)
            for tp in tps:
                self._first_offset.pop(tp, None)
            on_assign(tps)

        def revoked(_: Consumer, parts: list[KafkaTopicPartition]) -> None:
            tps = [TopicPartition(p.topic, p.partition) for p in parts]
            on_revoke(tps)
            self._drop(tps)

        def lost(_: Consumer, parts: list[KafkaTopicPartition]) -> None:
            tps = [TopicPartition(p.topic, p.partition) for p in parts]
            self._drop(tps)  # first: on_lost may rewind what is still assigned (exactly-once)
            on_lost(tps)

        self._consumer.subscribe(list(self.cfg.topics), on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        """Up to ``max_records`` records of assigned partitions; waits up to ``timeout_s`` only when none is
        ready. Raises SourceFailed on a fatal consumer error."""
        try:
            messages = self._consumer.consume(num_messages=max_records, timeout=0)
            if not messages and timeout_s > 0:
                one = self._consumer.poll(timeout_s)
                messages = [one] if one is not None else []
        except KafkaException as exc:  # raised out of consume() by a fatal error (or by our callbacks)
            self._on_error(exc.args[0])
            return []
        now = self._clock()
        records = []
        expected = self._next_offset
        assigned = self.assignment
        for m in messages:
            err = m.error()
            if err is not None:
                self._on_error(err)
                continue
            record = self._to_record(m, now)
            if record.tp not in assigned:  # fetched before a revoke the same consume() call served: the
                continue  # partition is no longer ours (its next owner processes it); its offset is not tracked
            next_offset = expected.get(record.tp)
            if next_offset is not None and record.offset < next_offset:
                self._redelivered(record)
                continue
            if next_offset is None and record.tp not in self._first_offset:
                self._first_offset[record.tp] = record.offset
            expected[record.tp] = record.offset + 1
            records.append(record)
        return records

    def _redelivered(self, record: InputRecord) -> None:
        """librdkafka handed out an offset it already delivered in this assignment, with no seek of ours
        (seen after pause/resume on a partition with no committed offset): the record is already tracked,
        so taking it again would process it twice. Dropped, and counted."""
        if self.num_redelivered_dropped == 0 or self.num_redelivered_dropped % 1000 == 0:
            log.warning("the consumer delivered %s[%d]@%d again without a seek; dropping the repeat "
                        "(%d so far)", record.tp.topic, record.tp.partition, record.offset,
                        self.num_redelivered_dropped + 1)
        self.num_redelivered_dropped += 1

    def _to_record(self, m: Message, now: float) -> InputRecord:
        # once per record, so no typing.cast (a call at run time): a consumed message has all of these
        name = (m.topic(), m.partition())
        tp = self._tps.get(name)  # type: ignore[arg-type]
        if tp is None:
            tp = self._tps[name] = TopicPartition(*name)  # type: ignore[arg-type, index]
        ts_type, ts = m.timestamp()
        headers: Any = m.headers() or []
        # positional: measurably cheaper than keywords
        return InputRecord(m.value(), m.key(), headers, tp, m.offset(), ts if ts_type else None, now)  # type: ignore[arg-type]

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        """Store offsets (committed by the next auto-commit or :meth:`commit`)."""
        mine = {tp: off for tp, off in watermarks.items() if tp in self.assignment}
        if mine:
            try:
                self._consumer.store_offsets(offsets=[KafkaTopicPartition(tp.topic, tp.partition, off)
                                                      for tp, off in mine.items()])
                self.commits.stored(mine)
            except KafkaException as err:  # e.g. the partition was revoked a moment ago
                log.debug("store_offsets failed: %s", err)

    def uncommitted_since(self) -> float | None:
        return self.commits.since

    def commit(self, watermarks: dict[TopicPartition, int]) -> None:
        """Store and commit ``watermarks`` synchronously (revoke, shutdown).

        Storing first matters: auto-commit (and ``close``) commit the *stored* offsets, and a stale stored
        offset would otherwise be committed over the one committed here.
        """
        offsets = [KafkaTopicPartition(tp.topic, tp.partition, off) for tp, off in watermarks.items()]
        if not offsets:
            return
        self.store(watermarks)
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as err:
            if err.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("offset commit failed: %s", err.args[0].str())

    def _drop(self, tps: list[TopicPartition]) -> None:
        """Forget partitions that leave this consumer. Paused ones are resumed first: librdkafka keeps a
        partition's pause across a revoke, so one that came back later would stay paused for good (seen:
        an operator idle with lag 1,372 after a rebalance)."""
        paused = [tp for tp in tps if tp in self._paused]
        if paused:
            try:
                self._consumer.resume([KafkaTopicPartition(tp.topic, tp.partition) for tp in paused])
            except KafkaException as err:
                log.debug("resume of leaving partitions failed: %s", err)
        self.assignment.difference_update(tps)
        self.commits.forget(tps)
        self._paused.difference_update(tps)
        self._forget_positions(tps)
        for tp in tps:
            self._first_offset.pop(tp, None)

    def _forget_positions(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._next_offset.pop(tp, None)

    def lag(self) -> dict[TopicPartition, int]:
        """Consumer lag (records) per assigned partition, as of librdkafka's last statistics."""
        return {tp: lag for tp, lag in self._lag.items() if tp in self.assignment}

    def _on_stats(self, stats_json: str) -> None:
        stats = read_statistics(stats_json)
        if stats.broker_up:
            self._connectivity.reachable()
        self._lag = stats.lag

    def group_metadata(self) -> Any:
        """The consumer's group metadata, for ``send_offsets_to_transaction`` (fences zombies, KIP-447)."""
        return self._consumer.consumer_group_metadata()

    def rewind(self, tps: Iterable[TopicPartition]) -> None:
        """Seek ``tps`` back to their committed offsets (or to auto.offset.reset where none is committed):
        after an aborted transaction, everything since the last commit is read and processed again."""
        tps = list(tps)
        parts = [KafkaTopicPartition(tp.topic, tp.partition) for tp in tps]
        if not parts:
            return
        self._forget_positions(tps)
        reset = OFFSET_BEGINNING if self.cfg.auto_offset_reset == "earliest" else OFFSET_END
        for part in committed_offsets(self._consumer, parts):  # waits out a moving coordinator
            if part.offset < 0:  # nothing committed yet: back to where this assignment started reading
                part.offset = self._first_offset.get(TopicPartition(part.topic, part.partition), reset)
            self._consumer.seek(part)

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        tps = [tp for tp in tps if tp not in self._paused and tp in self.assignment]
        if tps:
            self._consumer.pause([KafkaTopicPartition(tp.topic, tp.partition) for tp in tps])
            self._paused.update(tps)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        tps = [tp for tp in tps if tp in self._paused]
        if tps:
            self._consumer.resume([KafkaTopicPartition(tp.topic, tp.partition) for tp in tps])
            self._paused.difference_update(tps)

    @property
    def paused_partitions(self) -> set[TopicPartition]:
        return self._paused

    def is_exhausted(self) -> bool:
        return False

    def close(self) -> None:
        """Leave the group and close. A static member's ``close`` alone would not leave (KIP-345: its
        partitions would wait for the session timeout, as if it had crashed), so it unsubscribes first and
        serves the revoke: the group hands its partitions over at once, as a dynamic member's would."""
        try:
            if self.group_instance_id is not None and self.assignment and not self._failed:
                self._consumer.unsubscribe()
                deadline = time.monotonic() + _LEAVE_TIMEOUT_S
                while self.assignment and time.monotonic() < deadline:
                    self._consumer.poll(0.1)  # serves the revoke; a record fetched meanwhile is not tracked
            self._consumer.close()
        except (KafkaException, RuntimeError) as err:  # after a fatal error, or closed twice
            log.debug("closing the consumer: %s", err)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() == KafkaError._FATAL:  # an error event reports a fatal error as _FATAL
            if (is_fenced_instance(err) and self.derived_instance_id and self._callbacks is not None
                    and self._rejoins.take(self._clock())):
                self._rejoin(err)
                return
            self._failed = True
            raise SourceFailed(f"kafka consumer: fatal error: {err.str()}{fatal_hint(err, self.group_instance_id)}")
        # Transient: broker down, leader moving... librdkafka retries by itself.
        if is_connectivity(err):
            self._connectivity.error(err.str())
        else:
            log.warning("kafka consumer: %s", err.str())

    def _rejoin(self, err: KafkaError) -> None:
        """Replace the fenced consumer with a new one under the same id: its partitions are lost (nothing of
        theirs is committed; the delivery strategy rewinds or lets them be redone) and come back with the
        new member's assignment."""
        assert self._callbacks is not None
        budget = self._rejoins
        log.warning("kafka consumer: %s; the group.instance.id %s is this process's own (its host slot lock is "
                    "held here), so it joins the group again with a new consumer (%d of %d within %.0f s)",
                    err.str(), self.group_instance_id, len(budget.times_s), budget.max_rejoins, budget.window_s)
        lost = list(self.assignment)
        self._drop(lost)
        self._paused.clear()
        if lost:
            self._callbacks[2](lost)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as close_err:  # it is already failed: nothing to leave
            log.debug("closing the fenced consumer: %s", close_err)
        self._consumer = Consumer(self._conf)
        self._subscribe()
