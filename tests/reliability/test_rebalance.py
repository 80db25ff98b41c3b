"""Rebalances under load: operators join, crash and leave one group while records flow.

Two operators start; a third joins; one is killed with ``kill -9``; the one that joined is removed with
SIGTERM; the last one finishes the stream. Each duplicate is charged to the event after which its second
copy was written (same key, so both copies share an output partition and their offsets order them): only
the crash may cause any, and no more than its in-flight bound. Joins and graceful leaves hand partitions
over at committed offsets (the revoke drains and commits), so they must cause none. Under exactly-once a
``read_committed`` reader sees no duplicate at all.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from sluice.operator.runner import _POLL_BATCH
from tests.reliability.ledger import Progress, open_transaction_partitions, read_tally, sequenced
from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

# Long enough that records remain for the graceful leave: the survivors finish their own partitions during the
# crashed one's 6 s session timeout (at 15,000 the stream once ended before the leave on a quiet machine).
NUM_RECORDS = 18_000
MAX_IN_FLIGHT = 500
COMMIT_INTERVAL_MS = 20
MAX_BATCH = 50
BATCH_MS = 100  # at most 500 records/s per operator: the stream outlasts the 6 s session timeout
ENV = {"RELIABILITY_BATCH_MS": str(BATCH_MS)}


def num_assigned(op: Operator) -> int:
    """How many non-empty assignments the operator has logged."""
    return sum(1 for line in op.log().splitlines() if "runner: assigned in-" in line)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_join_crash_and_graceful_leave(kafka_bootstrap: str, tmp_path: Path, delivery: str,
                                       record_property: pytest.RecordProperty) -> None:
    topics = make_topics(kafka_bootstrap, partitions=6)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, sequenced(NUM_RECORDS))
    group = unique_topic("g")
    exactly_once = delivery == "exactly_once"
    # Exactly-once: the default transactional id, which must differ between the processes on this host (a
    # clash would fence one). Nobody restarts the crashed one, so its open transaction ends only when the
    # broker times it out: keep that short.
    eos = {"transaction_interval_ms": 200, "transaction_timeout_ms": 5000, "max_batch_time_s": 1} \
        if exactly_once else None
    pipeline = write_pipeline(
        tmp_path / "p.yaml", kafka_bootstrap, topics, group,
        batching={"max_batch_size": MAX_BATCH, "max_queue_delay_ms": 5},
        runtime={"max_in_flight": MAX_IN_FLIGHT, "commit_interval_ms": COMMIT_INTERVAL_MS, "drain_timeout_s": 20},
        exactly_once=eos)

    def start(name: str) -> Operator:
        return Operator(pipeline, tmp_path / f"{name}.log", env={**ENV, "SLUICE_RUN_DIR": str(tmp_path / "run")})

    progress = Progress(kafka_bootstrap, t_out)
    snapshots: dict[str, dict[int, int]] = {}  # event -> output end offsets just before it
    ops: list[Operator] = []
    try:
        a, b = start("a"), start("b")
        ops += [a, b]
        wait_until(lambda: num_assigned(a) and num_assigned(b) and progress.count() >= 2000, 120,
                   "two operators sharing the stream", (a, b))

        snapshots["join"] = end_offsets(kafka_bootstrap, t_out)
        c = start("c")
        ops.append(c)
        mark = progress.count() + 2000
        wait_until(lambda: num_assigned(c) > 0 and progress.count() >= mark, 120, "the third operator to join",
                   (a, b, c))
        # The group commits nothing while a rebalance is in progress, so a crash inside one replays the whole
        # rebalance (seen: 1,450 duplicates for a 3 s cooperative rebalance). Crash once commits flow again.
        settled = sum(committed_offsets(kafka_bootstrap, group, t_in).values())
        wait_until(lambda: sum(committed_offsets(kafka_bootstrap, group, t_in).values()) > settled, 120,
                   "commits to flow again after the join", (a, b, c), interval_s=0.3)

        snapshots["crash"] = end_offsets(kafka_bootstrap, t_out)
        before = num_assigned(a) + num_assigned(c)
        b.kill()
        # its partitions move once its session expires; then let their uncommitted records be redone
        wait_until(lambda: num_assigned(a) + num_assigned(c) > before, 60, "the crashed one's partitions to move",
                   (a, c))
        # the stream may be nearly done by the time the partitions move: ask for no more than it holds
        mark = min(progress.count() + 1500, NUM_RECORDS)
        wait_until(lambda: progress.count() >= mark, 120, "the stream to go on after the crash", (a, c))
        assert progress.count() < NUM_RECORDS, "the stream ended before the graceful leave"

        snapshots["leave"] = end_offsets(kafka_bootstrap, t_out)
        before = num_assigned(a)
        assert c.terminate() == 0, c.log()[-3000:]
        assert "SIGTERM received" in c.log()
        wait_until(lambda: num_assigned(a) > before, 60, "the leaver's partitions to move", (a,))
        wait_until(lambda: committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in),
                   180, "the last operator to commit every input", (a,), interval_s=0.5)
        assert a.terminate() == 0, a.log()[-3000:]
    finally:
        progress.close()
        for op in ops:
            op.close()
    for op in ops:
        assert "Traceback" not in op.log(), op.log()[-3000:]
    if exactly_once:  # three live processes on one host: three transactional ids, none fenced
        ids = [re.search(r"exactly-once with transactional id (\S+)", op.log()) for op in ops]
        assert len({m.group(1) for m in ids if m}) == 3, [m and m.group(1) for m in ids]

    isolation = "read_committed" if exactly_once else "read_uncommitted"
    tally = read_tally(kafka_bootstrap, t_out, t_dlq, isolation=isolation, min_records=NUM_RECORDS)
    assert tally.missing(NUM_RECORDS) == []
    assert not tally.dead
    copies: dict[int, list[tuple[int, int]]] = defaultdict(list)  # seq -> [(output partition, offset)]
    for rec in tally.outputs:
        copies[json.loads(rec.value or b"")["seq"]].append((rec.partition, rec.offset))
    charged = dict.fromkeys(["start", "join", "crash", "leave"], 0)
    for places in copies.values():
        for partition, offset in sorted(places)[1:]:
            event = "start"
            for name, ends in snapshots.items():  # in event order
                if offset >= ends[partition]:
                    event = name
            charged[event] += 1
    record_property("duplicates_by_event", charged)
    print(f"\nrebalance, {delivery}: duplicates charged to each event: {charged}")
    if exactly_once:
        assert sum(charged.values()) == 0, "a read_committed reader saw duplicates"
        assert open_transaction_partitions(kafka_bootstrap, t_out) == {}
    per_crash = MAX_IN_FLIGHT + _POLL_BATCH + int(MAX_BATCH / (BATCH_MS / 1000) * 2 * COMMIT_INTERVAL_MS / 1000)
    assert charged["crash"] <= per_crash
    assert charged["leave"] == 0, "a graceful leave (SIGTERM) must hand its partitions over without duplicates"
    assert charged["join"] == 0 and charged["start"] == 0, "a join must hand partitions over without duplicates"
