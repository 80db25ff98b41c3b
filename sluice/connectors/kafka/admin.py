"""Admin lookups the sink needs once at start: how large a record a topic accepts."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

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
        admin = AdminClient({k: v for k, v in self._conf.items() if not _producer_only(k)})
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT_S)
            topic_limit = int(configs["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TimeoutError) as err:  # TimeoutError: no broker answers
            self._unanswered = isinstance(err, TimeoutError)
            log.warning("cannot read max.message.bytes of topic %s (%s); assuming %d", topic,
                        err or f"no answer within {_TIMEOUT_S} s", producer_limit)
            topic_limit = producer_limit
        return min(topic_limit, producer_limit) - RECORD_OVERHEAD_BYTES


def _producer_only(key: str) -> bool:
    """Producer settings an admin client refuses or has no use for."""
    return key in ("enable.idempotence", "acks", "linger.ms", "queue.buffering.max.messages", "transactional.id",
                   "transaction.timeout.ms", "logger", "message.max.bytes", "stats_cb",
                   "statistics.interval.ms") or key.startswith("batch.")
