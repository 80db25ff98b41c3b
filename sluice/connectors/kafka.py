"""Kafka source and sink on confluent-kafka (librdkafka).

Source: a cooperative-sticky consumer whose offsets are *stored* only by the operator, from the offset
tracker's watermark, and committed by librdkafka's auto-commit (or synchronously on revoke and shutdown).
Sink: an idempotent producer with ``acks=all``; every produce carries a delivery callback, which the
operator turns into an offset-tracker acknowledgement.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from sluice.config import KafkaSecurity, RegistryTls, Tls
from sluice.config import KafkaSink as KafkaSinkConfig
from sluice.config import KafkaSource as KafkaSourceConfig
from sluice.operator.ports import ProduceFailed, SourceFailed
from sluice.operator.record import InputRecord, TopicPartition

log = logging.getLogger(__name__)

PartitionsCallback = Callable[[list[TopicPartition]], None]


class KafkaSource:
    """Consumes the pipeline's topics. All methods are called from the operator's main thread."""

    def __init__(self, cfg: KafkaSourceConfig, commit_interval_ms: int, clock: Callable[[], float] = time.monotonic,
                 transactional: bool = False) -> None:
        """``transactional``: offsets are committed only through the producer's transactions
        (exactly-once), never by this consumer, and only committed input records are read."""
        self.cfg = cfg
        self._clock = clock
        self.transactional = transactional
        conf: dict[str, Any] = {
            "bootstrap.servers": cfg.bootstrap_servers,
            "group.id": cfg.group_id,
            # Incremental rebalances: partitions that stay with this process keep flowing during one.
            "partition.assignment.strategy": "cooperative-sticky",
            # The operator stores an offset only once every output of that record and of all earlier
            # records of the partition is acknowledged; librdkafka then commits what was stored.
            "enable.auto.offset.store": False,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": commit_interval_ms,
            "auto.offset.reset": cfg.auto_offset_reset,
            "enable.partition.eof": False,
            "logger": logging.getLogger("sluice.librdkafka.consumer"),
            # librdkafka's statistics carry each partition's consumer lag; parsed every few seconds.
            "statistics.interval.ms": 5000,
            "stats_cb": self._on_stats,
        }
        if transactional:
            conf.update({"enable.auto.commit": False, "isolation.level": "read_committed"})
        conf.update(security_config(cfg.security))
        conf.update(cfg.config)
        self._consumer = Consumer(conf)
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
            if record.tp not in assigned:
                # Fetched before a revoke that the same consume() call served: the partition is no longer
                # ours (its next owner processes the record), and its offset must not be tracked here.
                continue
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
        name = (cast(str, m.topic()), cast(int, m.partition()))
        tp = self._tps.get(name)
        if tp is None:
            tp = self._tps[name] = TopicPartition(*name)
        ts_type, ts = m.timestamp()
        headers = cast("list[tuple[str, bytes]]", m.headers() or [])
        # positional: measurably cheaper than keywords, once per record
        return InputRecord(m.value(), m.key(), headers, tp, cast(int, m.offset()), ts if ts_type else None, now)

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        """Store offsets (committed by the next auto-commit or :meth:`commit`)."""
        offsets = [KafkaTopicPartition(tp.topic, tp.partition, off) for tp, off in watermarks.items()
                   if tp in self.assignment]
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as err:  # e.g. the partition was revoked a moment ago
                log.debug("store_offsets failed: %s", err)

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
        try:
            stats = json.loads(stats_json)
            lag = {}
            for topic, t in stats.get("topics", {}).items():
                for part, p in t.get("partitions", {}).items():
                    if int(part) >= 0 and p.get("consumer_lag", -1) >= 0:
                        lag[TopicPartition(topic, int(part))] = int(p["consumer_lag"])
            self._lag = lag
        except (ValueError, KeyError, TypeError) as err:
            log.debug("unreadable librdkafka statistics: %s", err)

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
        for part in self._consumer.committed(parts, timeout=30):
            if part.error is not None:
                raise KafkaException(part.error)
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

    def close(self) -> None:
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as err:  # after a fatal error, or closed twice
            log.debug("closing the consumer: %s", err)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() == KafkaError._FATAL:  # an error event reports a fatal error as _FATAL
            hint = ""
            if "group.instance.id" in self.cfg.config or "fenced" in err.str().lower():
                hint = (" (another running consumer uses this group.instance.id: each process of a group needs "
                        "its own)")
            raise SourceFailed(f"kafka consumer: fatal error: {err.str()}{hint}")
        # Transient: broker down, leader moving... librdkafka retries by itself.
        log.warning("kafka consumer: %s", err.str())


def security_config(security: KafkaSecurity | None) -> dict[str, str]:
    """librdkafka settings for ``security``: SASL_SSL with both parts, SASL_PLAINTEXT or SSL with one,
    nothing for a plaintext cluster. Secrets are revealed here only, into the client's configuration;
    librdkafka itself prints sensitive properties as "[redacted]" in its debug logs."""
    if security is None:
        return {}
    sasl, tls = security.sasl, security.tls
    conf: dict[str, str] = {
        "security.protocol": ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT"),
    }
    if sasl is not None:
        conf.update({"sasl.mechanism": sasl.mechanism, "sasl.username": sasl.username,
                     "sasl.password": sasl.password.get_secret_value()})
    if tls is not None:
        # "https": the broker's certificate must name the host it was reached at (librdkafka's default).
        conf["ssl.endpoint.identification.algorithm"] = "https" if tls.verify_hostname else "none"
        conf.update(tls_files(tls))
    return conf


def tls_files(tls: Tls | RegistryTls) -> dict[str, str]:
    """The ``ssl.*`` file settings (and key password, revealed here) that librdkafka and confluent-kafka's
    Schema Registry client both take under the same names."""
    conf = {key: value for key, value in (("ssl.ca.location", tls.ca_location),
                                          ("ssl.certificate.location", tls.certificate_location),
                                          ("ssl.key.location", tls.key_location)) if value is not None}
    if tls.key_password is not None:
        conf["ssl.key.password"] = tls.key_password.get_secret_value()
    return conf


DeliveryCallback = Callable[[KafkaError | None, Message], None]


class KafkaSink:
    """Produces output and dead-letter records. ``produce`` may be called from any thread."""

    def __init__(self, bootstrap_servers: str, cfg: KafkaSinkConfig | None = None,
                 transactional_id: str | None = None, transaction_timeout_ms: int = 60_000) -> None:
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            # No duplicates or reordering from the producer's own retries, and a write counts only once
            # every in-sync replica has it: the output side of at-least-once.
            "enable.idempotence": True,
            "acks": "all",
            # A few ms of lingering turns per-record produce calls into broker-sized batches.
            "linger.ms": 5,
            "queue.buffering.max.messages": 500_000,
            "logger": logging.getLogger("sluice.librdkafka.producer"),
            # without it, confluent-kafka raises a fatal error (a fenced producer) out of poll() and flush()
            "error_cb": self._on_error,
        }
        if transactional_id is not None:
            conf.update({"transactional.id": transactional_id, "transaction.timeout.ms": transaction_timeout_ms})
        if cfg is not None:
            conf.update(security_config(cfg.security))
            conf.update(cfg.config)
        self._conf = conf
        self._transactional = transactional_id is not None
        self._producer = Producer(conf)
        self._poller = threading.get_ident()  # the thread that serves delivery reports
        self._unanswered = False  # max_message_bytes got no answer from any broker

    # ---- transactions (exactly-once). Called by the main thread only, never while another thread produces.

    def init_transactions(self, timeout_s: float = 60) -> None:
        """Register the transactional id: fences an older producer with the same id and aborts (or
        completes) the transaction it left open."""
        self._producer.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any, timeout_s: float) -> None:
        """Add the consumer offsets to the open transaction and commit it (outputs and offsets at once)."""
        if offsets:
            parts = [KafkaTopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()]
            self._producer.send_offsets_to_transaction(parts, group_metadata, timeout_s)
        self._producer.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self._producer.abort_transaction(timeout_s)

    def recreate(self) -> None:
        """Replace the producer by a new one with the same settings (after an ambiguous commit or abort,
        librdkafka lacking KIP-890): its ``init_transactions`` settles whatever the old one left open."""
        old, self._producer = self._producer, Producer(self._conf)
        old.purge()
        old.flush(0)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]],
                on_delivery: DeliveryCallback) -> None:
        """Queue one record; when the local queue is full, wait for room (this is backpressure).

        Delivery reports are only ever served on the thread that calls :meth:`poll`: that thread serves
        them while it waits here, any other thread just sleeps until the poller has made room.
        """
        while True:
            try:
                self._producer.produce(topic, value, key, headers=cast(Any, headers) or None,
                                       on_delivery=on_delivery)
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                raise ProduceFailed(f"cannot produce to {topic}: {err.str()}{self._hint(err)}") from None
            except BufferError:
                if threading.get_ident() == self._poller:
                    self._producer.poll(0.05)
                else:
                    time.sleep(0.005)

    def poll(self, timeout_s: float = 0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        self._poller = threading.get_ident()
        try:
            served: int = self._producer.poll(timeout_s)
        except KafkaException as exc:
            self._on_error(exc.args[0])
            return 0
        return served

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries; returns how many are still outstanding."""
        self._poller = threading.get_ident()
        try:
            left: int = self._producer.flush(timeout_s)
        except KafkaException as exc:
            self._on_error(exc.args[0])
            return len(self._producer)
        return left

    def __len__(self) -> int:
        return len(self._producer)

    def _on_error(self, err: KafkaError) -> None:
        """Client-level errors, from librdkafka's error callback or raised out of poll() / flush() (as
        confluent-kafka does with a transactional producer's fatal error). A fatal one also fails every queued
        delivery and the next produce or transaction call, which stop the operator; this says why."""
        if err.fatal():
            log.error("kafka producer: fatal error: %s%s", err.str(), self._hint(err))
        else:  # transient (broker down, leader moving): librdkafka retries by itself
            log.warning("kafka producer: %s", err.str())

    def _hint(self, err: KafkaError) -> str:
        if err.fatal() and self._transactional:
            return (" (under exactly-once this usually means that another running process registered the same "
                    "transactional id and fenced this one)")
        return ""

    def max_message_bytes(self, topic: str) -> int:
        """The largest record ``topic`` accepts: the smaller of its ``max.message.bytes`` and this producer's
        ``message.max.bytes``, less room for the record's own framing. Falls back to the producer's limit
        when the topic's configuration cannot be read (no describe permission, say)."""
        producer_limit = int(self._conf.get("message.max.bytes", 1_000_000))
        if self._unanswered:  # no broker answered the last time: do not wait another 15 s at start
            log.warning("cannot read max.message.bytes of topic %s (no broker answered); assuming %d", topic,
                        producer_limit)
            return producer_limit - _RECORD_OVERHEAD_BYTES
        admin = AdminClient({k: v for k, v in self._conf.items() if not _producer_only(k)})
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(timeout=15)
            topic_limit = int(configs["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TimeoutError) as err:  # TimeoutError: no broker answers
            self._unanswered = isinstance(err, TimeoutError)
            log.warning("cannot read max.message.bytes of topic %s (%s); assuming %d", topic,
                        err or "no answer within 15 s", producer_limit)
            topic_limit = producer_limit
        return min(topic_limit, producer_limit) - _RECORD_OVERHEAD_BYTES


_RECORD_OVERHEAD_BYTES = 512  # record and batch framing around key, value and headers


def _producer_only(key: str) -> bool:
    return key in ("enable.idempotence", "acks", "linger.ms", "queue.buffering.max.messages", "transactional.id",
                   "transaction.timeout.ms", "logger", "message.max.bytes") or key.startswith("batch.")
