"""Test helpers for a real Kafka broker: run one with deploy/kafka/kafka.sh, and talk to it with plain
confluent-kafka calls that do not go through Sluice's own connector code.

Every helper either does what it says or raises with a message that names the topic, the broker and
what was missing; none of them swallows an error or returns partial data silently.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"
Headers = Sequence[tuple[str, str | bytes | None]]
# (key, value) or (key, value, headers)
RecordIn = tuple[bytes | str | None, bytes | str | None] | tuple[bytes | str | None, bytes | str | None, Headers]


@dataclass(frozen=True)
class ConsumedRecord:
    """One record as the broker stored it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]  # in the order they were produced


@dataclass(frozen=True)
class SecuredListeners:
    """The SASL (and SASL_SSL) listeners of a broker started with ``kafka.sh start --sasl/--tls``, or given
    by the SLUICE_KAFKA_SASL_* / SLUICE_KAFKA_TLS_* variables (what ``kafka.sh security`` prints)."""

    sasl_bootstrap: str  # SASL_PLAINTEXT: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for `username`
    username: str
    password: str
    tls_bootstrap: str | None = None  # SASL_SSL, same users; None when the broker has no TLS listener
    ca_location: str | None = None  # PEM of the CA that signed the TLS listener's certificate

    @classmethod
    def from_env(cls, env: dict[str, str]) -> SecuredListeners | None:
        if not env.get("SLUICE_KAFKA_SASL_BOOTSTRAP"):
            return None
        return cls(sasl_bootstrap=env["SLUICE_KAFKA_SASL_BOOTSTRAP"], username=env["SLUICE_KAFKA_SASL_USER"],
                   password=env["SLUICE_KAFKA_SASL_PASSWORD"], tls_bootstrap=env.get("SLUICE_KAFKA_TLS_BOOTSTRAP"),
                   ca_location=env.get("SLUICE_KAFKA_TLS_CA"))

    def client_config(self, mechanism: str, tls: bool = False, password: str | None = None) -> dict[str, str]:
        """confluent-kafka settings for a plain client of the SASL (or, with ``tls``, SASL_SSL) listener."""
        conf = {"bootstrap.servers": self.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism, "sasl.username": self.username,
                "sasl.password": self.password if password is None else password}
        if tls:
            if self.tls_bootstrap is None or self.ca_location is None:
                raise RuntimeError("this broker has no TLS listener (start it with kafka.sh start --tls)")
            conf.update({"bootstrap.servers": self.tls_bootstrap, "security.protocol": "SASL_SSL",
                         "ssl.ca.location": self.ca_location})
        return conf


class KafkaCluster:
    """A cluster started by kafka.sh in `run_dir`; the test owns it and must call `stop()`."""

    def __init__(self, run_dir: Path, num_nodes: int, bootstrap: str, secured: SecuredListeners | None = None) -> None:
        self.run_dir = run_dir
        self.num_nodes = num_nodes
        self.bootstrap = bootstrap  # "127.0.0.1:P[,127.0.0.1:P+1,...]"
        self.secured = secured  # the SASL / SASL_SSL listeners, when started with secured=True

    @classmethod
    def start(cls, run_dir: Path, num_nodes: int = 1, timeout_s: float = 120.0, secured: bool = False,
              hosts: Sequence[tuple[str, str]] = ()) -> KafkaCluster:
        """Start a fresh cluster on free loopback ports; returns once every node serves requests.

        ``secured`` adds SASL_PLAINTEXT and SASL_SSL listeners (``kafka.sh start --tls``) next to the
        plaintext one. ``hosts``: a (network namespace, address) per node, to run each node as a host of its
        own (``kafka.sh --netns``; tests/support/network.py makes them). The cluster also stops by itself
        once this Python process exits, even if it is killed.
        """
        port, controller_port = free_port_block(num_nodes)
        args = ["start", "--nodes", str(num_nodes), "--port", str(port), "--controller-port", str(controller_port),
                "--watch-pid", str(os.getpid())]
        if secured:
            args.append("--tls")
        if hosts:
            args += ["--netns", ",".join(f"{ns}={address}" for ns, address in hosts)]
        bootstrap = _run_script(run_dir, *args, "--timeout", str(int(timeout_s))).strip()
        listeners = None
        if secured:
            lines = _run_script(run_dir, "security").splitlines()
            listeners = SecuredListeners.from_env(dict(line.split("=", 1) for line in lines if "=" in line))
        return cls(run_dir, num_nodes, bootstrap, listeners)

    def node_bootstrap(self, node_id: int) -> str:
        """The client address of one node (node ids are 1..num_nodes)."""
        return self.bootstrap.split(",")[node_id - 1]

    def kill_node(self, node_id: int, signal: str = "KILL") -> None:
        """Stop one node, keeping its data: KILL is a crash, TERM a controlled shutdown."""
        _run_script(self.run_dir, "kill-node", str(node_id), "--signal", signal)

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Restart a node stopped by `kill_node`; returns once it is unfenced again."""
        _run_script(self.run_dir, "start-node", str(node_id), "--timeout", str(int(timeout_s)))

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop every node: SIGTERM, then SIGKILL for any still running after `timeout_s`.

        Safe to call twice. A node whose controlled shutdown needs a controller quorum that the other
        nodes already took down can hang for minutes; the timeout bounds that for test teardown.
        """
        _run_script(self.run_dir, "stop", "--timeout", str(int(timeout_s)))


def _run_script(run_dir: Path, *args: str) -> str:
    env = dict(os.environ, SLUICE_PYTHON=os.environ.get("SLUICE_PYTHON", sys.executable))
    proc = subprocess.run(
        ["bash", str(KAFKA_SCRIPT), *args, "--dir", str(run_dir)],
        capture_output=True, text=True, env=env, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kafka.sh {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


def free_port_block(num_nodes: int) -> tuple[int, int]:
    """Client ports P..P+n-1, controller ports P+100.. and the secured listeners' P+200.., P+300..: all
    free now, below the ephemeral range."""
    for _ in range(200):
        port = random.randrange(20000, 32000 - 400)
        wanted = [port + offset + i for offset in (0, 100, 200, 300) for i in range(num_nodes)]
        if all(_port_is_free(p) for p in wanted):
            return port, port + 100
    raise RuntimeError("no free block of loopback ports found between 20000 and 32000")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def unique_topic(prefix: str) -> str:
    """A topic name no other test (or earlier run against the same broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str, name: str, partitions: int, replication: int = 1,
    config: dict[str, str] | None = None, timeout_s: float = 30.0, client: dict[str, str] | None = None,
) -> None:
    """Create a topic and wait until its metadata shows every partition with a leader.

    ``client``: extra client settings (SASL credentials, say)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client or {})})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication, config=config or {})
    admin.create_topics([topic], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if (meta is not None and meta.error is None and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name!r} created on {bootstrap} but not visible with leaders after {timeout_s}s")


def produce(
    bootstrap: str, topic: str, records: Iterable[RecordIn], partition: int | None = None,
    config: dict[str, str | int | bool] | None = None, timeout_s: float = 30.0,
) -> list[tuple[int, int]]:
    """Produce records (idempotent, acks=all) and flush; returns (partition, offset) per record, in order.

    Raises if any record was not acknowledged by the broker within `timeout_s`.
    """
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,  # acks=all, and retries after a leader change cannot duplicate
        "linger.ms": 5,
        "message.timeout.ms": int(timeout_s * 1000),
        **(config or {}),
    })
    results: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def on_delivery(index: int):  # noqa: ANN202 - confluent-kafka callback
        def callback(err: KafkaError | None, msg) -> None:  # noqa: ANN001
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                results[index] = (msg.partition(), msg.offset())
        return callback

    for index, record in enumerate(records):
        key, value = record[0], record[1]
        headers = list(record[2]) if len(record) > 2 else None
        results.append(None)
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery(index),
                    partition=-1 if partition is None else partition,  # -1: the default partitioner
                )
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.1)
    remaining = producer.flush(timeout_s)
    if errors or remaining:
        raise RuntimeError(f"produce to {topic!r} on {bootstrap}: {remaining} undelivered, errors: {errors[:5]}")
    return [r for r in results if r is not None]


def _partitions(bootstrap: str, topic: str, client: dict[str, str] | None = None) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client or {})})
    meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        raise RuntimeError(f"topic {topic!r} not found on {bootstrap}: {meta.error if meta else 'no metadata'}")
    return sorted(meta.partitions)


def consume_all(
    bootstrap: str, topic: str, expected_count: int | None = None, timeout_s: float = 30.0,
    isolation: str = "read_uncommitted", client: dict[str, str] | None = None,
) -> list[ConsumedRecord]:
    """Read every partition from the beginning until each is at its end (and, if given, at least
    `expected_count` records arrived); returns records sorted by (partition, offset).

    No consumer group offsets are committed. "End" is the high watermark for read_uncommitted and the
    last stable offset for read_committed. Raises TimeoutError if the end is not reached in time.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": unique_topic("consume-all"),  # assign() ignores it, but librdkafka requires one
        "enable.auto.commit": False,
        "enable.partition.eof": True,  # tells us when a partition is fully read
        "isolation.level": isolation,
        **(client or {}),
    })
    try:
        partitions = _partitions(bootstrap, topic, client)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end = dict.fromkeys(partitions, False)
        records: list[ConsumedRecord] = []
        deadline = time.monotonic() + timeout_s
        while not (all(at_end.values()) and (expected_count is None or len(records) >= expected_count)):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"consume_all({topic!r}): {len(records)} records after {timeout_s}s "
                    f"(expected {expected_count}), partitions at end: {at_end}")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            partition = cast(int, msg.partition())  # set on every message from a consumer
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end[partition] = True
                    continue
                raise RuntimeError(f"consume_all({topic!r}) on {bootstrap}: {err}")
            at_end[partition] = False
            records.append(ConsumedRecord(
                topic=topic, partition=partition, offset=cast(int, msg.offset()), key=msg.key(),
                value=msg.value(), headers=tuple(cast(list[tuple[str, bytes | None]], msg.headers() or [])),
            ))
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset (next record to read) per partition; partitions without one are left out."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [TopicPartition(topic, p) for p in _partitions(bootstrap, topic)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout=10) if tp.offset >= 0}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The high watermark (offset the next record will get) per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("end-offsets")})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in _partitions(bootstrap, topic)
        }
    finally:
        consumer.close()
