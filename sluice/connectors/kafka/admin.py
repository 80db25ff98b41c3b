"""Admin lookups the sink needs once at start: how large a record a topic accepts.

The admin client logs through ``sluice.librdkafka.admin`` like every client of Sluice's (librdkafka's own
levels, never a raw ``%6|...`` line on stderr); confluent-kafka hands a client's queued lines over only when
it is polled, so each lookup polls its client before letting it go.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from sluice.connectors.kafka.connectivity import librdkafka_logger

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 512  # record and batch framing around key, value and headers
_TIMEOUT_S = 15


class TopicLimits:
    """The largest record each topic accepts: the smaller of its ``max.message.bytes`` and the producer's
    ``message.max.bytes``, less room for the record's own framing. Falls back to the producer's limit when
    a topic's configuration cannot be read (no describe permission, say); after a lookup no broker answered,
    later ones do not wait again."""

    def __init__(self, producer_conf: dict[str, Any]) -> None:
        self._conf = producer_conf
        self._unanswered = False  # no broker answered the last lookup

    def max_message_bytes(self, topic: str) -> int:
        producer_limit = int(self._conf.get("message.max.bytes", 1_000_000))
        if self._unanswered:  # do not wait another 15 s at start
            log.warning("cannot read max.message.bytes of topic %s (no broker answered); assuming %d", topic,
                        producer_limit)
            return producer_limit - RECORD_OVERHEAD_BYTES
        conf: dict[str, Any] = {k: v for k, v in self._conf.items() if not _producer_only(k)}
        conf["logger"] = librdkafka_logger("admin")
        admin = AdminClient(conf)
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT_S)
            topic_limit = int(configs["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TimeoutError) as err:  # TimeoutError: no broker answers
            self._unanswered = isinstance(err, TimeoutError)
            log.warning("cannot read max.message.bytes of topic %s (%s); assuming %d", topic,
                        err or f"no answer within {_TIMEOUT_S} s", producer_limit)
            topic_limit = producer_limit
        finally:
            admin.poll(0)  # hands librdkafka's queued lines to the logger
        return min(topic_limit, producer_limit) - RECORD_OVERHEAD_BYTES


def _producer_only(key: str) -> bool:
    """Producer settings an admin client refuses or has no use for."""
    return key in ("enable.idempotence", "acks", "linger.ms", "queue.buffering.max.messages", "transactional.id",
                   "transaction.timeout.ms", "logger", "message.max.bytes", "stats_cb",
                   "statistics.interval.ms") or key.startswith("batch.")
