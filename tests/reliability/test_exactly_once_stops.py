"""Exactly-once operators that stop on an error: they say why in one line, lose nothing, block no reader.

* Two processes with one transactional id (a pipeline file with an explicit id copied to two hosts): the
  older is fenced and must stop -- it may not write another record -- with a message naming the cause, not a
  traceback; whatever it had not committed is done again by the group, so a ``read_committed`` reader still
  sees every input exactly once.
* A record the engine cannot handle and no dead-letter topic: the operator stops without committing past
  it, and aborts its open transaction on the way out, so ``read_committed`` readers of the output topic are
  not held back until the broker's transaction timeout (a minute by default).
* A second SIGINT while the first one's drain waits for a wedged engine: the process exits within 2 s with
  130, its open transaction aborted (a ``read_committed`` reader sees nothing of it) and nothing committed.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.reliability.ledger import Progress, open_transaction_partitions, read_tally, sequenced
from tests.reliability.operators import Operator, copy_stops_the_first, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

NUM_RECORDS = 6_000
FIRST_POISON = 3_000
ENV = {"RELIABILITY_BATCH_MS": "20"}  # at most 50 records / 20 ms = 2,500 records/s per operator


def test_a_duplicated_transactional_id_fences_the_older_process_cleanly(kafka_bootstrap: str,
                                                                        tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=4)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS))
    group = unique_topic("g")
    eos = {"transactional_id": f"copied-{group}", "transaction_interval_ms": 200}
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              runtime={"commit_interval_ms": 20, "drain_timeout_s": 20}, exactly_once=eos)
    progress = Progress(kafka_bootstrap, t_out)
    try:
        log, copy_log = copy_stops_the_first(pipeline, tmp_path, progress.count, ENV)
    finally:
        progress.close()
    assert "Traceback" not in log, log[-3000:]
    assert "fenced" in log.lower() and "transactional id" in log, log[-3000:]
    assert "Traceback" not in copy_log
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, isolation="read_committed", min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == []
    assert tally.num_duplicates == 0
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
    assert open_transaction_partitions(kafka_bootstrap, t_out) == {}


def test_a_stop_on_a_poison_record_aborts_the_open_transaction(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=1)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS, {FIRST_POISON}))
    group = unique_topic("g")
    # long transactions, so that one is open, holding outputs, when the poison record comes
    eos = {"transaction_interval_ms": 30_000, "transaction_max_batches": 1000, "transaction_timeout_ms": 60_000}
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group, exactly_once=eos)
    doc = yaml.safe_load(pipeline.read_text())
    del doc["dead_letter"]
    pipeline.write_text(yaml.safe_dump(doc))
    op = Operator(pipeline, tmp_path / "op.log", env={**ENV, "SLUICE_RUN_DIR": str(tmp_path / "run")})
    try:
        assert op.wait(120) == 1, op.log()[-3000:]
    finally:
        op.close()
    log = op.log()
    assert "Traceback" not in log, log[-3000:]
    assert open_transaction_partitions(kafka_bootstrap, t_out) == {}  # at once, not after 60 s
    assert "no dead_letter topic is configured" in log and "aborted the open transaction" in log, log[-3000:]
    committed = committed_offsets(kafka_bootstrap, group, t_in)
    assert all(offset <= FIRST_POISON for offset in committed.values()), committed


def test_a_second_sigint_stops_at_once_and_aborts_the_open_transaction(kafka_bootstrap: str,
                                                                      tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=1)
    t_in, t_out, t_dlq = topics
    num_before = 2_000
    produce(kafka_bootstrap, t_in, sequenced(num_before) + [("wedge", json.dumps({"seq": num_before,
                                                                                  "text": "hang"}))])
    group = unique_topic("g")
    eos = {"transaction_interval_ms": 30_000, "transaction_max_batches": 1000, "transaction_timeout_ms": 60_000}
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group, exactly_once=eos)
    op = Operator(pipeline, tmp_path / "op.log", env={**ENV, "RELIABILITY_HANG": "1"})
    produced = Progress(kafka_bootstrap, t_out, isolation="read_uncommitted")
    try:
        # every record before the wedge is produced, inside the one open transaction; the engine hangs
        wait_until(lambda: produced.count() >= num_before, 120, "the outputs before the wedge", (op,))
        assert open_transaction_partitions(kafka_bootstrap, t_out) != {}
        op.proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert op.alive(), op.log()[-3000:]  # the first one drains: it waits for the engine
        sent_s = time.monotonic()
        op.proc.send_signal(signal.SIGINT)
        code = op.wait(30)
        took_s = time.monotonic() - sent_s
    finally:
        produced.close()
        op.close()
    log = op.log()
    assert code == 130, log[-3000:]
    assert took_s < 2, f"the forced stop took {took_s:.1f} s"
    assert "Traceback" not in log, log[-3000:]
    assert "stopped by a second SIGINT" in log and "aborted the open transaction" in log, log[-3000:]
    assert open_transaction_partitions(kafka_bootstrap, t_out) == {}  # aborted, not left to time out
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, isolation="read_committed")
    assert tally.outputs == [] and tally.dead == []  # nothing of the aborted transaction is visible
    assert committed_offsets(kafka_bootstrap, group, t_in).get(0, 0) <= 0  # and no input offset committed
