"""The Kafka sink: an idempotent producer with ``acks=all`` on confluent-kafka (librdkafka), the operator's
:class:`~sluice.operator.ports.Sink`; transactional under exactly-once.

Every produce carries a delivery callback, which the operator turns into an acknowledgement in its in-flight
ledger. Delivery reports are served only on the thread that calls :meth:`KafkaSink.poll` (the intake thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from sluice.config import KafkaSink as KafkaSinkConfig
from sluice.connectors.kafka.admin import TopicLimits
from sluice.connectors.kafka.connectivity import (
    ConnectivityLog,
    is_connectivity,
    librdkafka_logger,
)
from sluice.connectors.kafka.security import security_config
from sluice.connectors.kafka.statistics import read_statistics
from sluice.operator.ports import ProduceFailed
from sluice.operator.record import TopicPartition

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]


class KafkaSink:
    """Produces output and dead-letter records. ``produce`` may be called from any thread."""

    def __init__(self, bootstrap_servers: str, cfg: KafkaSinkConfig | None = None,
                 transactional_id: str | None = None, transaction_timeout_ms: int = 60_000) -> None:
        self._connectivity = ConnectivityLog("kafka producer", log, time.monotonic)
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            # No duplicates or reordering from the producer's own retries, and a write counts only once
            # every in-sync replica has it: the output side of at-least-once.
            "enable.idempotence": True,
            "acks": "all",
            # A few ms of lingering turns per-record produce calls into broker-sized batches.
            "linger.ms": 5,
            "queue.buffering.max.messages": 500_000,
            "logger": librdkafka_logger("producer"),
            # without it, confluent-kafka raises a fatal error (a fenced producer) out of poll() and flush()
            "error_cb": self._on_error,
            # the brokers' states, to say when they are reachable again after an outage (connectivity.py)
            "statistics.interval.ms": 5000,
            "stats_cb": self._on_stats,
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
        self._limits = TopicLimits(conf)

    # ---- transactions (exactly-once). Called by the intake thread only, never while another thread produces.

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

    def num_pending(self) -> int:
        return len(self._producer)

    def _on_error(self, err: KafkaError) -> None:
        """Client-level errors, from librdkafka's error callback or raised out of poll() / flush() (as
        confluent-kafka does with a transactional producer's fatal error). A fatal one also fails every queued
        delivery and the next produce or transaction call, which stop the operator; this says why."""
        if err.fatal():
            log.error("kafka producer: fatal error: %s%s", err.str(), self._hint(err))
        elif is_connectivity(err):  # librdkafka retries by itself; logged by change, not per attempt
            self._connectivity.error(err.str())
        else:  # transient (leader moving...): librdkafka retries by itself
            log.warning("kafka producer: %s", err.str())

    def _on_stats(self, stats_json: str) -> None:
        if read_statistics(stats_json).broker_up:
            self._connectivity.reachable()

    def _hint(self, err: KafkaError) -> str:
        if err.fatal() and self._transactional:
            return (" (under exactly-once this usually means that another running process registered the same "
                    "transactional id and fenced this one)")
        return ""

    def max_message_bytes(self, topic: str) -> int:
        """The largest record ``topic`` accepts (sluice/connectors/kafka/admin.py)."""
        return self._limits.max_message_bytes(topic)
