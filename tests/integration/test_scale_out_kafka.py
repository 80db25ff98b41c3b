"""Scale-out: more ``sluice run`` processes in one consumer group share a topic's partitions; when one
leaves, the others take its partitions over and nothing is lost (at-least-once).

Three processes over a 6-partition topic, each with its own ``client.id`` so that the group description
(read with a plain AdminClient, not through Sluice) says which process owns which partitions.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient

from tests.integration.pipelines import ROOT, write_pipeline
from tests.support.kafka import consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka

NUM_PARTITIONS = 6
NUM_PROCESSES = 3
RECORDS_PER_PARTITION = 100


def _assignment(admin: AdminClient, group: str) -> dict[str, set[int]]:
    """client.id -> partitions it owns, as the group coordinator describes the group right now."""
    description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    owned: dict[str, set[int]] = {}
    for member in description.members:
        parts = member.assignment.topic_partitions if member.assignment else []
        owned.setdefault(member.client_id, set()).update(tp.partition for tp in parts)
    return owned


def _wait_for_assignment(bootstrap: str, group: str, members: set[str], timeout_s: float = 60) -> dict[str, set[int]]:
    """Until exactly ``members`` are in the group, each with at least one partition, together all of them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    owned: dict[str, set[int]] = {}
    while time.monotonic() < deadline:
        owned = _assignment(admin, group)
        if (set(owned) == members and all(owned.values())
                and set().union(*owned.values()) == set(range(NUM_PARTITIONS))
                and sum(len(p) for p in owned.values()) == NUM_PARTITIONS):
            return owned
        time.sleep(0.3)
    raise AssertionError(f"group {group}: wanted members {sorted(members)} sharing {NUM_PARTITIONS} partitions "
                         f"within {timeout_s:.0f}s; the coordinator says {owned}")


def _records_in(log: Path) -> int:
    """How many records a stopped ``sluice run`` consumed, from its final log line."""
    match = re.search(r"done: .* \| ([\d,]+) in, ", log.read_text())
    assert match, f"no 'done:' line in {log.name}:\n{log.read_text()[-2000:]}"
    return int(match.group(1).replace(",", ""))


def _produce_round(bootstrap: str, topic: str, first_seq: int) -> list[int]:
    """RECORDS_PER_PARTITION records into every partition; returns their sequence numbers."""
    seqs = []
    for partition in range(NUM_PARTITIONS):
        batch = list(range(first_seq + partition * RECORDS_PER_PARTITION,
                           first_seq + (partition + 1) * RECORDS_PER_PARTITION))
        produce(bootstrap, topic, [(f"k{s}", json.dumps({"seq": s, "text": f"t{s}"})) for s in batch],
                partition=partition)
        seqs += batch
    return seqs


def test_three_processes_share_six_partitions_and_survivors_take_over_a_leaver(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    started = time.monotonic()
    topic_in, topic_out = unique_topic("scale-in"), unique_topic("scale-out")
    create_topic(kafka_bootstrap, topic_in, NUM_PARTITIONS)
    create_topic(kafka_bootstrap, topic_out, NUM_PARTITIONS)
    group = unique_topic("scale-group")

    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    try:
        for i in range(NUM_PROCESSES):
            name = f"sluice-{i}"
            path = write_pipeline(tmp_path / f"{name}.yaml", kafka_bootstrap, topic_in, topic_out, group,
                                  batching={"max_batch_size": 32, "max_queue_delay_ms": 5})
            doc = yaml.safe_load(path.read_text())
            doc["source"]["kafka"]["config"]["client.id"] = name  # one pipeline file per pod, as in a Deployment
            path.write_text(yaml.safe_dump(doc))
            logs[name] = tmp_path / f"{name}.log"
            with logs[name].open("wb") as log:
                procs[name] = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(path)],
                                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

        # 1. Every process gets partitions, and together they process every record.
        owned = _wait_for_assignment(kafka_bootstrap, group, set(procs))
        first = _produce_round(kafka_bootstrap, topic_in, 0)
        out = consume_all(kafka_bootstrap, topic_out, expected_count=len(first), timeout_s=60)
        assert {json.loads(r.value)["seq"] for r in out} == set(first)
        for name, log in logs.items():  # each one's own log says what it was given
            assert "assigned " in log.read_text(), f"{name} never logged an assignment:\n{log.read_text()[-2000:]}"

        # 2. One leaves (a scale-down: SIGTERM, drain, commit); the other two take its partitions over.
        leaver = "sluice-1"
        procs[leaver].send_signal(signal.SIGTERM)
        assert procs[leaver].wait(timeout=30) == 0, logs[leaver].read_text()[-3000:]
        # It consumed exactly the records of the partitions it owned: each process did its share.
        assert _records_in(logs[leaver]) == RECORDS_PER_PARTITION * len(owned[leaver])
        survivors = set(procs) - {leaver}
        after = _wait_for_assignment(kafka_bootstrap, group, survivors)
        assert owned[leaver] <= set().union(*after.values())

        second = _produce_round(kafka_bootstrap, topic_in, len(first))
        out = consume_all(kafka_bootstrap, topic_out, expected_count=len(first) + len(second), timeout_s=60)
        counts = Counter(json.loads(r.value)["seq"] for r in out)
        missing = set(first + second) - set(counts)
        assert not missing, f"{len(missing)} records never processed, e.g. {sorted(missing)[:10]}"
        duplicates = sum(c - 1 for c in counts.values())
        # At-least-once allows repeats of what was in flight at the leave; a graceful leave commits what it
        # finished before its partitions move, so here there are none to allow.
        print(f"\nscale-out: {len(counts)} records, {duplicates} duplicates, leaver owned {sorted(owned[leaver])}, "
              f"after: { {k: sorted(v) for k, v in after.items()} }, {time.monotonic() - started:.1f} s")
        assert duplicates == 0, f"{duplicates} records processed twice after a graceful leave"

        for name in survivors:
            procs[name].send_signal(signal.SIGTERM)
        for name in survivors:
            assert procs[name].wait(timeout=30) == 0, logs[name].read_text()[-3000:]
        # Together the three consumed every record once: nobody re-read what the leaver had committed.
        assert sum(_records_in(log) for log in logs.values()) == len(first) + len(second)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
