"""Static group membership (``group.instance.id``): a restarted process takes its partitions back at once.

Sluice derives the id from the host's instance slot (sluice/operator/instance.py), so a process killed and
restarted gets the dead one's id, and with it its partitions, without waiting out the session timeout. A
graceful stop still leaves the group at once. A copy of the same id in a second live process (a user-given
id, say) makes the broker fence the first one, which must stop with a message naming the cause (not a
traceback); the group loses nothing.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.reliability.ledger import Progress, read_tally, sequenced
from tests.reliability.operators import Operator, copy_stops_the_first, wait_until
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


# ------------------------------------------------------------------ the id Sluice derives by itself

SESSION_TIMEOUT_MS = 45_000  # librdkafka's default: what a restart would wait without static membership
BACK_WITHIN_S = 10.0  # a restart joins, and is given its partitions, well inside the session timeout
ASSIGNED = "sluice.operator.runner: assigned "
NUM_HANDED_OVER = 4_000  # at 250 records/s per process: half of them left when the first stops


def _stamp_s(line: str) -> float:
    """Seconds of the day from a log line's ``%(asctime)s`` stamp (2026-01-01 12:00:00,123)."""
    clock = line.split(" ")[1]
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds.replace(",", "."))


def _first_line(log: str, fragment: str) -> str:
    return next(line for line in log.splitlines() if fragment in line)


@pytest.mark.slow
def test_a_process_killed_and_restarted_gets_its_partitions_back_within_seconds(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap, partitions=2)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS))
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              consumer={"session.timeout.ms": SESSION_TIMEOUT_MS})
    env = {**ENV, "SLUICE_RUN_DIR": str(tmp_path / "run")}
    progress = Progress(kafka_bootstrap, t_out)
    first = restarted = None
    try:
        first = Operator(pipeline, tmp_path / "first.log", env=env)
        wait_until(lambda: progress.count() >= 500, 120, "the first process to produce", (first,))
        first.kill()
        restarted = Operator(pipeline, tmp_path / "restarted.log", idle_exit_s=3, env=env)
        wait_until(lambda: ASSIGNED in restarted.log(), 40, "the restarted process to be assigned", (restarted,))
        assert restarted.wait(120) == 0, restarted.log()[-3000:]
        first_log, log = first.log(), restarted.log()
    finally:
        progress.close()
        for op in (first, restarted):
            if op is not None:
                op.close()
    member = _first_line(first_log, "static group membership as").split(" as ")[1].split(":")[0]
    assert member == f"sluice-{group}-{socket.gethostname()}-0"
    joined = _first_line(log, "static group membership as")
    assert member in joined  # the restart took the dead process's slot, so its id
    assigned = _first_line(log, ASSIGNED)
    assert f"{t_in}[0]" in assigned and f"{t_in}[1]" in assigned  # both partitions, in one assignment
    waited_s = _stamp_s(assigned) - _stamp_s(joined)
    assert waited_s < BACK_WITHIN_S, f"partitions came back after {waited_s:.1f} s (session timeout 45 s)"
    assert "Traceback" not in log
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == []
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


@pytest.mark.slow
def test_a_static_member_stopped_with_sigterm_hands_its_partitions_over_at_once(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    """Closing alone, a static member would hold its partitions for the session timeout, as if crashed; a
    graceful stop leaves the group, so a scale-down hands over as fast as without static membership."""
    topics = make_topics(kafka_bootstrap, partitions=2)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_HANDED_OVER))
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              consumer={"session.timeout.ms": SESSION_TIMEOUT_MS},
                              runtime={"max_in_flight": 100, "commit_interval_ms": 100, "drain_timeout_s": 20})
    env = {"RELIABILITY_BATCH_MS": "200", "SLUICE_RUN_DIR": str(tmp_path / "run")}  # 250 records/s each
    assigned = ASSIGNED + t_in  # a non-empty assignment (a cooperative rebalance also assigns nothing)
    progress = Progress(kafka_bootstrap, t_out)
    one = two = None
    try:
        one = Operator(pipeline, tmp_path / "one.log", env=env)
        wait_until(lambda: assigned in one.log(), 60, "the first process to be assigned both partitions", (one,))
        two = Operator(pipeline, tmp_path / "two.log", idle_exit_s=5, env=env)
        wait_until(lambda: assigned in two.log(), 60, "the second process to get a partition", (one, two))
        assert progress.count() < NUM_HANDED_OVER // 2
        assert one.terminate() == 0, one.log()[-3000:]  # drains what it has in flight (100 at most), leaves
        stopped_s = time.monotonic()
        wait_until(lambda: two.log().count(assigned) >= 2, 40, "the other process to take the partition over", (two,))
        took_s = time.monotonic() - stopped_s
        assert two.wait(120) == 0, two.log()[-3000:]
    finally:
        progress.close()
        for op in (one, two):
            if op is not None:
                op.close()
    assert took_s < BACK_WITHIN_S
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, min_records=NUM_HANDED_OVER)
    assert tally.missing(NUM_HANDED_OVER) == [] and tally.num_duplicates == 0  # a graceful leave repeats nothing
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)

