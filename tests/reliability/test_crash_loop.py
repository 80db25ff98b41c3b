"""Crash loop: ``kill -9`` the operator at random moments, restart it each time, and count the outputs.

Each crash happens after a random amount of new output (so always mid-stream) plus a random delay (so at a
random point of a batch or transaction). The seed is fixed (``RELIABILITY_SEED`` overrides it) so a
failure reproduces. Restarts keep the consumer's ``group.instance.id`` (static membership): the new process
takes over at once instead of waiting out the dead one's session timeout, as a restarted pod would.
"""

from __future__ import annotations

import os
import random
import re
import socket
import time
from pathlib import Path

import pytest

from sluice.operator.runner import _POLL_BATCH
from tests.reliability.ledger import Progress, Tally, open_transaction_partitions, read_tally, sequenced
from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

SEED = int(os.environ.get("RELIABILITY_SEED", "20261130"))
NUM_RECORDS = 20_000
NUM_CRASHES = 5
MAX_IN_FLIGHT = 500
COMMIT_INTERVAL_MS = 20
MAX_BATCH = 50
BATCH_MS = 10  # engine cost per call: caps the operator at MAX_BATCH / BATCH_MS = 5,000 records/s
ENV = {"RELIABILITY_BATCH_MS": str(BATCH_MS)}


def crash_loop(bootstrap: str, tmp_path: Path, exactly_once: dict[str, object] | None,
               isolation: str) -> tuple[Tally, set[int], str, tuple[str, str, str]]:
    rng = random.Random(SEED)
    topics = make_topics(bootstrap, partitions=3)
    t_in, t_out, t_dlq = topics
    poison = set(rng.sample(range(NUM_RECORDS), NUM_RECORDS // 200))
    produce(bootstrap, t_in, sequenced(NUM_RECORDS, poison))
    group = unique_topic("g")
    pipeline = write_pipeline(
        tmp_path / "p.yaml", bootstrap, topics, group, consumer={"group.instance.id": f"{group}-member"},
        batching={"max_batch_size": MAX_BATCH, "max_queue_delay_ms": 5},
        runtime={"max_in_flight": MAX_IN_FLIGHT, "commit_interval_ms": COMMIT_INTERVAL_MS, "drain_timeout_s": 20},
        exactly_once=exactly_once)
    env = {**ENV, "SLUICE_RUN_DIR": str(tmp_path / "run")}  # instance slots of this test only
    progress = Progress(bootstrap, t_out, t_dlq)
    try:
        for crash in range(NUM_CRASHES):
            before = progress.count()
            target = before + rng.randint(500, 2500)
            op = Operator(pipeline, tmp_path / f"run{crash}.log", env=env)
            try:
                wait_until(lambda target=target: progress.count() >= target, 120,
                           f"crash {crash}: output to grow past {target} (seed {SEED})", (op,))
                time.sleep(rng.uniform(0, 0.3))
                assert op.alive(), f"operator exited before crash {crash} (seed {SEED}):\n{op.log()[-3000:]}"
                op.kill()
            finally:
                op.close()
        assert progress.count() < NUM_RECORDS, "the crashes did not all happen mid-stream"
    finally:
        progress.close()
    final = Operator(pipeline, tmp_path / "final.log", idle_exit_s=3, env=env)
    try:
        assert final.wait(240) == 0, final.log()[-3000:]
        assert "Traceback" not in final.log()
    finally:
        final.close()
    tally = read_tally(bootstrap, t_out, t_dlq, isolation=isolation, min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == [], f"lost inputs (seed {SEED})"
    assert {i for i, c in tally.dead_counts.items() if c} == poison  # exactly the poison records dead-letter
    assert not any(tally.out_counts[i] for i in poison)
    assert committed_offsets(bootstrap, group, t_in) == end_offsets(bootstrap, t_in)
    return tally, poison, group, topics


def test_exactly_once_survives_kill_9_loop(kafka_bootstrap: str, tmp_path: Path) -> None:
    # The default transactional id: each restart must take its killed predecessor's (instance slot 0 is
    # free again) so that registering it aborts the transaction the predecessor left open.
    eos = {"transaction_interval_ms": 200}
    tally, poison, group, (_, t_out, t_dlq) = crash_loop(kafka_bootstrap, tmp_path, eos,
                                                         isolation="read_committed")
    ids = {m.group(1) for log in sorted(tmp_path.glob("*.log"))
           for m in re.finditer(r"exactly-once with transactional id (\S+)", log.read_text())}
    assert ids == {f"sluice-{group}-{socket.gethostname()}-0"}, ids
    assert tally.num_duplicates == 0, (
        f"{tally.num_duplicates} inputs seen more than once by a read_committed reader (seed {SEED})")
    assert all(tally.dead_counts[i] == 1 for i in poison)
    for topic in (t_out, t_dlq):  # every transaction committed or aborted: nothing holds the LSO back
        assert open_transaction_partitions(kafka_bootstrap, topic) == {}, f"open transactions on {topic}"


def test_at_least_once_survives_kill_9_loop(kafka_bootstrap: str, tmp_path: Path,
                                            record_property: pytest.RecordProperty) -> None:
    tally, _, _, _ = crash_loop(kafka_bootstrap, tmp_path, None, isolation="read_uncommitted")
    # What one crash can repeat: the records in flight (max_in_flight, overshot by at most one poll), plus
    # those acknowledged since the last commit -- offsets are stored and auto-committed every
    # commit_interval, so at most two intervals' worth at the engine's top rate.
    max_rate_per_s = MAX_BATCH / (BATCH_MS / 1000)
    per_crash = MAX_IN_FLIGHT + _POLL_BATCH + int(max_rate_per_s * 2 * COMMIT_INTERVAL_MS / 1000)
    record_property("duplicates", tally.num_duplicates)
    print(f"\nat-least-once crash loop: {tally.num_duplicates} duplicates after {NUM_CRASHES} crashes "
          f"(bound {NUM_CRASHES} x {per_crash})")
    assert tally.num_duplicates <= NUM_CRASHES * per_crash
