"""Pipeline files and topics for the reliability tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.kafka import create_topic, unique_topic

FUNCTION = "tests.reliability.funcs:paced_tag"


def make_topics(bootstrap: str, partitions: int, replication: int = 1,
                config: dict[str, str] | None = None) -> tuple[str, str, str]:
    """Fresh (input, output, dead-letter) topics; output and dead-letter have as many partitions as input."""
    names = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for name in names:
        create_topic(bootstrap, name, partitions, replication, config)
    return names


def write_pipeline(path: Path, bootstrap: str, topics: tuple[str, str, str], group: str, *,
                   consumer: dict[str, Any] | None = None, batching: dict[str, Any] | None = None,
                   runtime: dict[str, Any] | None = None, exactly_once: dict[str, Any] | None = None,
                   codec: dict[str, Any] | None = None) -> Path:
    """A pipeline (input -> paced_tag -> output, failures -> dead-letter) written to ``path``.

    ``exactly_once`` given: ``delivery: exactly_once`` with that section; otherwise at-least-once.
    ``consumer``: extra librdkafka settings of the source (they replace the defaults below).
    """
    t_in, t_out, t_dlq = topics
    doc: dict[str, Any] = {
        "name": "reliability",
        "source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [t_in], "group_id": group,
                             # 6 s is the broker's group.min.session.timeout.ms: dead members leave soonest
                             "config": {"session.timeout.ms": 6000, **(consumer or {})}}},
        "codec": codec or {"format": "json", "input_field": "text"},
        "batching": batching or {"max_batch_size": 50, "max_queue_delay_ms": 5},
        "engine": {"type": "python", "function": FUNCTION},
        "sink": {"kafka": {"topic": t_out}, "output": {"mode": "merge", "field": "tagged"}},
        "dead_letter": {"topic": t_dlq},
        "runtime": runtime or {"commit_interval_ms": 100, "drain_timeout_s": 20},
    }
    if exactly_once is not None:
        doc["delivery"] = "exactly_once"
        doc["exactly_once"] = exactly_once
    path.write_text(yaml.safe_dump(doc))
    return path
