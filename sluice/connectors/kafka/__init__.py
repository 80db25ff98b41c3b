"""Kafka on confluent-kafka (librdkafka): the source (consumer), the sink (producer, transactional under
exactly-once), the security settings both take, and the admin lookups the sink makes at start."""

from __future__ import annotations

from sluice.connectors.kafka.kafka_sink import KafkaSink
from sluice.connectors.kafka.kafka_source import KafkaSource
from sluice.connectors.kafka.security import security_config, tls_files

__all__ = ["KafkaSink", "KafkaSource", "security_config", "tls_files"]
