"""Exactly-once across a lost assignment: a process frozen past its session timeout loses its partitions.

While it is frozen (``SIGSTOP``, as a long GC pause or a starved container would), the group coordinator
expels it; when it runs again librdkafka reports the partitions *lost*. The open transaction holds outputs
of those partitions, whose offsets can no longer be committed by this member: it must be aborted, or the
records are processed again from the committed offsets and a ``read_committed`` reader sees them twice.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.ledger import Progress, read_tally, sequenced
from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

NUM_RECORDS = 3_000
ENV = {"RELIABILITY_BATCH_MS": "200"}  # batches of 50: at most 250 records/s, 12 s for the stream


def test_a_frozen_process_that_loses_its_partitions_commits_nothing_twice(kafka_bootstrap: str,
                                                                         tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=2)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS))
    group = unique_topic("g")
    # one long transaction, so that it is open, holding outputs, across the freeze
    eos = {"transaction_interval_ms": 20_000, "transaction_max_batches": 10_000, "transaction_timeout_ms": 60_000}
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group, exactly_once=eos)
    progress = Progress(kafka_bootstrap, t_out, isolation="read_uncommitted")  # counts open transactions too
    op = Operator(pipeline, tmp_path / "op.log", idle_exit_s=3, env={**ENV, "SLUICE_RUN_DIR": str(tmp_path / "r")})
    try:
        wait_until(lambda: progress.count() >= 300, 120, "outputs in the open transaction", (op,))
        os.kill(op.pid, signal.SIGSTOP)
        time.sleep(10)  # past the 6 s session timeout
        os.kill(op.pid, signal.SIGCONT)
        assert op.wait(180) == 0, op.log()[-3000:]
    finally:
        progress.close()
        op.close()
    log = op.log()
    assert "Traceback" not in log, log[-3000:]
    assert "lost in-" in log, log[-3000:]  # the freeze did cost the assignment
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, isolation="read_committed", min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == []
    assert tally.num_duplicates == 0, f"{tally.num_duplicates} inputs seen twice by a read_committed reader"
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
