"""Is a start under a static ``group.instance.id`` a restart? Only the group's coordinator knows.

A static member that goes away without leaving its group (a crash, ``kill -9``, a node lost) stays in it
until ``session.timeout.ms``; a process joining under the same id in that time gets the partitions back at
once, without a rebalance -- that is a restart under this id. A first start, a start after the session
timed out, or one after a graceful stop (Sluice's own leaves the group: sluice/connectors/kafka/kafka_source.py)
finds no such member, and gets its partitions by a rebalance like any new member.

Guarantees: :func:`static_member_present` asks once, within ``timeout_s``; it answers True only when the
broker described the group with a member of this id, and None (not known) when it could not ask, so a line
built by :func:`membership_line` never claims a restart that is not one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sluice.connectors.kafka.connectivity import librdkafka_logger

log = logging.getLogger(__name__)

# The consumer's own settings an admin client shares: how to reach and authenticate to the brokers.
_CONNECTION_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "enable.ssl.", "enable.sasl.", "socket.",
                        "broker.", "client.", "reconnect.", "api.version.", "metadata.", "oauthbearer.")


def admin_config(consumer_conf: Mapping[str, Any]) -> dict[str, Any]:
    """The connection and security settings of ``consumer_conf`` (consumer-only ones would each be a
    librdkafka warning on an admin client), logging through ``sluice.librdkafka.admin``."""
    conf = {k: v for k, v in consumer_conf.items() if k.startswith(_CONNECTION_PREFIXES)}
    conf["logger"] = librdkafka_logger("admin")
    return conf


def static_member_present(consumer_conf: Mapping[str, Any], group_id: str, instance_id: str,
                          timeout_s: float = 2.0) -> bool | None:
    """Whether ``group_id`` holds a member with ``group.instance.id`` ``instance_id`` now; None when the
    group could not be described within ``timeout_s`` (no broker answers, no permission)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(consumer_conf))
    try:
        future = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id]
        description = future.result(timeout=timeout_s + 1.0)
    except (KafkaException, TimeoutError) as err:
        log.debug("cannot describe consumer group %s: %s", group_id, err or "no answer")
        return None
    finally:
        admin.poll(0)  # hands librdkafka's queued lines to the logger (they wait for a poll)
    return holds(description, instance_id)


def holds(description: Any, instance_id: str) -> bool:
    """Whether a ``ConsumerGroupDescription`` lists a member with ``group.instance.id`` ``instance_id``."""
    return any(getattr(m, "group_instance_id", None) == instance_id for m in description.members or ())


def membership_line(instance_id: str, present: bool | None) -> str:
    """The start's log line about static membership: a restart is named only when it is one."""
    if present:
        return (f"static group membership as {instance_id}: restarted under this id while the group still "
                "holds it, so this process gets its partitions back at once, without a rebalance")
    return f"static group membership as {instance_id}"
