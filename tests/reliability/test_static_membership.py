"""Two processes with one ``group.instance.id``: the broker fences the older, which stops in one line.

Static membership (``group.instance.id``) lets a restarted pod take its partitions back without a
rebalance; a copy of the same id in a second live process makes the broker fence the first one. That
process must stop with a message naming the cause (not a traceback), and the group loses nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.ledger import Progress, read_tally, sequenced
from tests.reliability.operators import copy_stops_the_first
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

NUM_RECORDS = 6_000
ENV = {"RELIABILITY_BATCH_MS": "20"}  # at most 2,500 records/s


def test_a_copied_group_instance_id_stops_the_older_process_cleanly(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=2)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS))
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              consumer={"group.instance.id": f"{group}-pod-0"})
    progress = Progress(kafka_bootstrap, t_out)
    try:
        log, copy_log = copy_stops_the_first(pipeline, tmp_path, progress.count, ENV)
    finally:
        progress.close()
    assert "Traceback" not in log, log[-3000:]
    assert "stopped on error: kafka consumer: fatal error" in log and "group.instance.id" in log, log[-3000:]
    assert "Traceback" not in copy_log
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == []
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
