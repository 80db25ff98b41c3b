"""Broker faults while records flow: the one broker crashes and comes back; a partition leader dies.

The operator must ride both out in the same process (no restart) and lose nothing. Duplicates are allowed
(at-least-once: a group whose coordinator vanished may lose its partitions and redo uncommitted work).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.reliability.ledger import Progress, read_tally, sequenced
from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import KafkaCluster, committed_offsets, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

ENV = {"RELIABILITY_BATCH_MS": "50"}  # at most 1,000 records/s: the stream outlasts the fault
OUTAGE_S = 10.0


def all_committed(bootstrap: str, group: str, topic: str) -> bool:
    try:
        return committed_offsets(bootstrap, group, topic) == end_offsets(bootstrap, topic)
    except Exception:  # noqa: BLE001 - a broker still electing leaders: ask again
        return False


def run_through(bootstrap: str, tmp_path: Path, num_records: int, fault: Callable[[str], None],
                record_property: pytest.RecordProperty, replication: int = 1) -> None:
    """Stream ``num_records`` through one operator: half produced before it starts, half after
    ``fault(input_topic)``, which runs once 1,500 outputs exist. Then check that every input came out,
    and that the operator never exited."""
    config = {"min.insync.replicas": "2"} if replication > 1 else None
    topics = make_topics(bootstrap, partitions=3, replication=replication, config=config)
    t_in, t_out, t_dlq = topics
    records = sequenced(num_records)
    produce(bootstrap, t_in, records[: num_records // 2])
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", bootstrap, topics, group)
    op = Operator(pipeline, tmp_path / "op.log", env=ENV)
    progress = Progress(bootstrap, t_out)
    try:
        wait_until(lambda: progress.count() >= 1500, 120, "the stream to start", (op,))
        assert progress.count() < num_records // 2, "too fast to be mid-stream"
        fault_s = time.monotonic()
        fault(t_in)
        assert op.alive(), op.log()[-3000:]
        produce(bootstrap, t_in, records[num_records // 2:], timeout_s=60)
        wait_until(lambda: all_committed(bootstrap, group, t_in), 180, "every input to be committed", (op,),
                   interval_s=0.5)
        record_property("recovered_after_s", round(time.monotonic() - fault_s, 1))
        assert op.terminate() == 0, op.log()[-3000:]
    finally:
        progress.close()
        op.close()
    assert "Traceback" not in op.log()
    tally = read_tally(bootstrap, t_out, t_dlq, min_records=num_records)
    assert tally.missing(num_records) == []
    record_property("duplicates", tally.num_duplicates)
    print(f"\n{num_records} records through the fault: {tally.num_duplicates} duplicates")


def test_single_broker_bounce(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    cluster = KafkaCluster.start(tmp_path / "kafka", num_nodes=1)
    try:
        def bounce(_: str) -> None:
            cluster.kill_node(1, signal="KILL")
            time.sleep(OUTAGE_S)
            cluster.start_node(1)

        run_through(cluster.bootstrap, tmp_path, 8000, bounce, record_property)
    finally:
        cluster.stop()


def test_partition_leader_loss(kafka_cluster3: KafkaCluster, tmp_path: Path,
                               record_property: pytest.RecordProperty) -> None:
    bootstrap = kafka_cluster3.bootstrap
    killed: list[int] = []

    def kill_leader(t_in: str) -> None:
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=t_in, timeout=10)
        leader = meta.topics[t_in].partitions[0].leader
        kafka_cluster3.kill_node(leader, signal="KILL")
        killed.append(leader)

    try:
        run_through(bootstrap, tmp_path, 8000, kill_leader, record_property, replication=3)
    finally:
        for node in killed:  # leave the module's cluster whole for its teardown
            kafka_cluster3.start_node(node)


def test_a_20_s_outage_is_a_handful_of_log_lines_and_the_stream_goes_on(tmp_path: Path) -> None:
    """The one broker down for 20 s while records flow: the log says it lost the brokers, maybe how long they
    have been gone, and when they are back -- not every failed connection attempt (at most 10 lines)."""
    cluster = KafkaCluster.start(tmp_path / "kafka", num_nodes=1)
    bootstrap = cluster.bootstrap
    topics = make_topics(bootstrap, partitions=3)
    t_in, t_out, _ = topics
    produce(bootstrap, t_in, sequenced(30_000))  # about 30 s of work: records flow into the outage
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", bootstrap, topics, group)
    op = Operator(pipeline, tmp_path / "op.log", env=ENV)
    progress = Progress(bootstrap, t_out)
    try:
        wait_until(lambda: progress.count() >= 500, 120, "the stream to start", (op,))
        before = len(op.log().splitlines())
        cluster.kill_node(1, signal="KILL")
        time.sleep(20)
        during = op.log().splitlines()[before:]
        cluster.start_node(1)
        wait_until(lambda: all_committed(bootstrap, group, t_in), 180, "every input to be committed", (op,),
                   interval_s=0.5)
        after = op.log().splitlines()[before:]
        assert op.terminate() == 0, op.log()[-3000:]
    finally:
        progress.close()
        op.close()
        cluster.stop()
    shown = "\n".join(after)
    print(f"\n{len(during)} lines in the 20 s outage, {len(after)} until every input was committed:\n{shown}")
    assert len(during) <= 10, shown
    assert any("lost the brokers" in line for line in during), shown
    assert any("brokers reachable again" in line for line in after), shown
