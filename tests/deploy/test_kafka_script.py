"""deploy/kafka/kafka.sh runs a real Kafka cluster that keeps records, keys, headers and order, and
survives the loss of a partition leader when it has three nodes."""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.kafka import (
    KAFKA_SCRIPT,
    KafkaCluster,
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.kafka


def _records(start: int, count: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    # 37 keys spread over the partitions; the sequence number in the value checks order and loss.
    return [
        (f"key-{i % 37}".encode(), f"value-{i}".encode(), [("seq", str(i).encode())])
        for i in range(start, start + count)
    ]


def _seq(value: bytes | None) -> int:
    assert value is not None
    return int(value.decode().removeprefix("value-"))


def test_single_node_keeps_every_record_with_keys_headers_and_partition_order(kafka_bootstrap: str) -> None:
    topic = unique_topic("script-roundtrip")
    create_topic(kafka_bootstrap, topic, partitions=3)
    sent = _records(0, 1000)
    produce(kafka_bootstrap, topic, sent)

    got = consume_all(kafka_bootstrap, topic, expected_count=1000)

    assert sorted(_seq(r.value) for r in got) == list(range(1000))  # none lost, none duplicated
    by_partition: dict[int, list[int]] = defaultdict(list)
    partition_of_key: dict[bytes | None, set[int]] = defaultdict(set)
    for r in got:
        seq = _seq(r.value)
        assert r.key == sent[seq][0]
        assert r.headers == (("seq", str(seq).encode()),)
        by_partition[r.partition].append(seq)
        partition_of_key[r.key].add(r.partition)
    assert len(by_partition) == 3  # keys really spread over all partitions
    for seqs in by_partition.values():
        assert seqs == sorted(seqs)  # read back in the order produced
    assert all(len(parts) == 1 for parts in partition_of_key.values())  # a key sticks to one partition
    assert sum(end_offsets(kafka_bootstrap, topic).values()) == 1000


def test_topics_are_not_auto_created(kafka_bootstrap: str) -> None:
    topic = unique_topic("never-created")
    with pytest.raises(RuntimeError, match="undelivered|timed out"):
        produce(kafka_bootstrap, topic, [(b"k", b"v")], timeout_s=2)
    assert topic not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics


def test_transactions_commit_and_abort(kafka_bootstrap: str) -> None:
    topic = unique_topic("script-txn")
    create_topic(kafka_bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_topic("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)

    committed = consume_all(kafka_bootstrap, topic, isolation="read_committed")
    everything = consume_all(kafka_bootstrap, topic, isolation="read_uncommitted")

    assert [r.value for r in committed] == [b"committed"]
    assert [r.value for r in everything] == [b"committed", b"aborted"]


def test_committed_offsets_reads_what_a_group_committed(kafka_bootstrap: str) -> None:
    topic, group = unique_topic("script-commit"), unique_topic("group")
    create_topic(kafka_bootstrap, topic, partitions=2)
    produce(kafka_bootstrap, topic, [(b"k", b"v")] * 10, partition=1)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 1, 7)], asynchronous=False)
    finally:
        consumer.close()

    assert committed_offsets(kafka_bootstrap, group, topic) == {1: 7}  # partition 0: nothing committed
    assert end_offsets(kafka_bootstrap, topic) == {0: 0, 1: 10}


def test_start_without_java_explains_and_exits_2(tmp_path: Path) -> None:
    # A PATH with every tool of the real one except java and mvn.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = bin_dir / name
            if name not in {"java", "mvn"} and not target.exists():
                target.symlink_to(os.path.join(directory, name))
    proc = subprocess.run(
        ["bash", str(KAFKA_SCRIPT), "start", "--dir", str(tmp_path / "run")],
        capture_output=True, text=True, env=dict(os.environ, PATH=str(bin_dir)), check=False,
    )
    assert proc.returncode == 2
    assert "java" in proc.stderr and "SLUICE_KAFKA_BOOTSTRAP=host:port" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _runs(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped by init."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_stop_ends_every_broker_process(tmp_path: Path) -> None:
    cluster = KafkaCluster.start(tmp_path, num_nodes=1)
    pid = int((tmp_path / "node-1" / "pid").read_text())
    assert _runs(pid)
    status = subprocess.run(["bash", str(KAFKA_SCRIPT), "status", "--dir", str(tmp_path)],
                            capture_output=True, check=False)
    assert status.returncode == 0

    cluster.stop()

    assert not _runs(pid)
    status = subprocess.run(["bash", str(KAFKA_SCRIPT), "status", "--dir", str(tmp_path)],
                            capture_output=True, check=False)
    assert status.returncode == 1


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=10)
    return meta.topics[topic].partitions[partition].leader


@pytest.mark.slow
def test_three_nodes_survive_the_loss_of_a_partition_leader(kafka_cluster3: KafkaCluster) -> None:
    bootstrap = kafka_cluster3.bootstrap
    topic = unique_topic("script-failover")
    create_topic(bootstrap, topic, partitions=3, replication=3)
    produce(bootstrap, topic, _records(0, 300))
    leader = _leader(bootstrap, topic, 0)

    kafka_cluster3.kill_node(leader, signal="KILL")
    survivor = next(n for n in range(1, 4) if n != leader)
    # acks=all with min.insync.replicas=2: the two survivors must both have every record.
    produce(bootstrap, topic, _records(300, 300), config={"acks": "all"}, timeout_s=60)

    assert _leader(kafka_cluster3.node_bootstrap(survivor), topic, 0) not in (leader, -1)
    got = consume_all(bootstrap, topic, expected_count=600, timeout_s=60)
    assert sorted(_seq(r.value) for r in got) == list(range(600))

    kafka_cluster3.start_node(leader)
    brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
    assert sorted(brokers) == [1, 2, 3]


def test_secured_listeners_only_on_request(kafka_cluster3: KafkaCluster) -> None:
    """Without --sasl/--tls a cluster has exactly the plaintext listener it always had, and says so."""
    props = (kafka_cluster3.run_dir / "node-1" / "server.properties").read_text()
    listeners = next(line for line in props.splitlines() if line.startswith("listeners="))
    assert listeners.count("://") == 2 and "PLAINTEXT://" in listeners and "CONTROLLER://" in listeners
    settings = [line for line in props.splitlines() if not line.startswith("#")]
    assert not [line for line in settings if "sasl" in line.lower() or "ssl" in line.lower()]
    proc = subprocess.run(["bash", str(KAFKA_SCRIPT), "security", "--dir", str(kafka_cluster3.run_dir)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "no secured listener" in proc.stderr
