"""What the Kafka source tells librdkafka, and why: the consumer's settings as one function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.config import KafkaSource as KafkaSourceConfig
from sluice.connectors.kafka.connectivity import librdkafka_logger
from sluice.connectors.kafka.security import security_config


def consumer_config(cfg: KafkaSourceConfig, commit_interval_ms: int, transactional: bool,
                    group_instance_id: str | None, stats_cb: Callable[[str], None],
                    on_commit: Callable[[Any, Any], None] | None = None) -> dict[str, Any]:
    """librdkafka settings of the source's consumer; the pipeline's own ``config`` entries override them.

    ``transactional``: offsets are committed only through the producer's transactions (exactly-once), and
    only committed records are read. ``group_instance_id``: static group membership. ``on_commit``: called
    with each commit's outcome (error, partitions), from the consumer's poll."""
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
        "logger": librdkafka_logger("consumer"),
        # librdkafka's statistics carry each partition's consumer lag; parsed every few seconds.
        "statistics.interval.ms": 5000,
        "stats_cb": stats_cb,
    }
    if on_commit is not None:
        conf["on_commit"] = on_commit
    if transactional:
        conf.update({"enable.auto.commit": False, "isolation.level": "read_committed"})
    if group_instance_id is not None:
        # Static membership: a process restarted under the same id (after a crash) gets its partitions
        # back at once, without a rebalance, as long as it returns within session.timeout.ms.
        conf["group.instance.id"] = group_instance_id
    conf.update(security_config(cfg.security))
    conf.update(cfg.config)
    return conf
