"""librdkafka's statistics documents (``statistics.interval.ms``), read for what Sluice needs: each
partition's consumer lag, and whether any broker is up (the clients' sign that an outage ended).

Pure: a JSON text in, plain data out; an unreadable document reads as nothing known.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from sluice.operator.record import TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Statistics:
    lag: dict[TopicPartition, int] = field(default_factory=dict)  # records behind the end, where known
    broker_up: bool = False  # some real broker (not a bootstrap placeholder) is UP


def read_statistics(text: str) -> Statistics:
    try:
        stats = json.loads(text)
        lag = {}
        for topic, t in stats.get("topics", {}).items():
            for part, p in t.get("partitions", {}).items():
                if int(part) >= 0 and p.get("consumer_lag", -1) >= 0:
                    lag[TopicPartition(topic, int(part))] = int(p["consumer_lag"])
        brokers = stats.get("brokers", {})
        up = any(isinstance(b, dict) and b.get("state") == "UP" and b.get("nodeid", -1) != -1
                 for b in brokers.values())
        return Statistics(lag, up)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        log.debug("unreadable librdkafka statistics: %s", err)
        return Statistics()
