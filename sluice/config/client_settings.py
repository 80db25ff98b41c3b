"""librdkafka settings Sluice's guarantees rest on: a pipeline's ``*.kafka.config`` may not override them.

``source.kafka.config`` and ``sink.kafka.config`` pass librdkafka settings through as they are (buffer
sizes, timeouts, compression). A few of them carry the delivery guarantees -- who commits offsets and when,
which records a consumer sees, whether the producer may duplicate -- or have an option of their own. Letting
the pass-through change those would void the guarantees without a word, so each is refused in one line
that names what governs it instead.
"""

from __future__ import annotations

from collections.abc import Mapping

_COMMITS = ("offsets are stored and committed by Sluice once every output of a record is acknowledged "
            "(`delivery` and `runtime.commit_interval_ms` govern it)")

CONSUMER: Mapping[str, str] = {
    "enable.auto.commit": _COMMITS,
    "enable.auto.offset.store": _COMMITS,
    "auto.commit.interval.ms": "set `runtime.commit_interval_ms`",
    "isolation.level": ("the consumer reads committed records only (`delivery: exactly_once` rests on it; "
                        "aborted outputs of an upstream transaction must not be processed)"),
    "group.id": "set `source.kafka.group_id`",
    "bootstrap.servers": "set `source.kafka.bootstrap_servers`",
    "auto.offset.reset": "set `source.kafka.auto_offset_reset`",
    "partition.assignment.strategy": ("Sluice's rebalance handling is written for cooperative-sticky "
                                      "(incremental) assignment"),
}

PRODUCER: Mapping[str, str] = {
    "enable.idempotence": ("the producer is always idempotent: its own retries must not duplicate or reorder "
                           "outputs (at-least-once and exactly-once both rest on it)"),
    "acks": "an output counts as delivered only once every in-sync replica has it (`acks=all`, always)",
    "transactional.id": "set `delivery.exactly_once.transactional_id`",
    "transaction.timeout.ms": "set `delivery.exactly_once.transaction_timeout_ms`",
    "bootstrap.servers": "set `sink.kafka.bootstrap_servers`",
}


def refuse_guarded(config: Mapping[str, object], guarded: Mapping[str, str]) -> None:
    """Raise ValueError naming the first guarded key in ``config`` and what governs it instead."""
    for key in config:
        why = guarded.get(key)
        if why is not None:
            raise ValueError(f"'{key}' cannot be set here: {why}; remove it from config")
