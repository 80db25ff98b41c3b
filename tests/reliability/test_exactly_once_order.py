"""Exactly-once when records finish out of order: a record that overtakes an earlier one of its partition
must not have its output committed before that one's.

Here a record that cannot be decoded is dead-lettered at once, while the two good records before it take
3 s each in the engine. If its dead-letter record went into the transaction that commits after the first
good record, that transaction would carry it with an offset watermark that stops before it (the second good
record is unfinished); a crash then processes it again and a ``read_committed`` reader sees two
dead-letter records for one input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, consume_all, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

ENV = {"RELIABILITY_BATCH_MS": "3000"}


def test_an_overtaking_dead_letter_is_committed_once_across_a_crash(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=1)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, [("k0", '{"seq": 0, "text": "record 0"}'), ("k1", '{"seq": 1, "text": "record 1"}'),
                                    ("k2", "not json")])
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              batching={"max_batch_size": 1, "max_queue_delay_ms": 0},
                              exactly_once={"transaction_interval_ms": 200})
    env = {**ENV, "SLUICE_RUN_DIR": str(tmp_path / "run")}
    first = Operator(pipeline, tmp_path / "first.log", env=env)
    try:
        # The first transaction to carry offsets commits once record 0 is done (a commit waits for the batch
        # in the engine); record 1 then has 3 s in the engine: crash then.
        wait_until(lambda: max(committed_offsets(kafka_bootstrap, group, t_in).values(), default=0) > 0, 60,
                   "the first transaction with offsets", (first,), interval_s=0.05)
        first.kill()
    finally:
        first.close()
    second = Operator(pipeline, tmp_path / "second.log", idle_exit_s=3, env=env)
    try:
        assert second.wait(120) == 0, second.log()[-3000:]
    finally:
        second.close()
    dead = consume_all(kafka_bootstrap, t_dlq, isolation="read_committed")
    outputs = consume_all(kafka_bootstrap, t_out, isolation="read_committed")
    assert [d.value for d in dead] == [b"not json"], f"{len(dead)} dead-letter records for one undecodable input"
    assert sorted(json.loads(o.value or b"")["seq"] for o in outputs) == [0, 1]
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
