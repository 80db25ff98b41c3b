"""Plumbing shared by the Kafka benchmarks: a broker to run against, and throughput read off a topic."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer  # noqa: E402

from tests.support.kafka import KafkaCluster, unique_topic  # noqa: E402
from tests.support.registry import RegistryServer  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@contextlib.contextmanager
def broker(bootstrap: str | None = None) -> Iterator[str]:
    """``bootstrap`` (or $SLUICE_KAFKA_BOOTSTRAP) if given, else a single-node broker in a temp dir."""
    bootstrap = bootstrap or os.environ.get("SLUICE_KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    cluster = KafkaCluster.start(Path(tempfile.mkdtemp(prefix="sluice-bench-kafka-")))
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


@contextlib.contextmanager
def registry(url: str | None = None) -> Iterator[str]:
    """``url`` (or $SLUICE_SCHEMA_REGISTRY_URL) if given, else a Schema Registry (deploy/registry) in a temp dir."""
    url = url or os.environ.get("SLUICE_SCHEMA_REGISTRY_URL")
    if url:
        yield url
        return
    run_dir = Path(tempfile.mkdtemp(prefix="sluice-bench-registry-"))
    server = RegistryServer.start(run_dir)
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def output_stamps(bootstrap: str, topic: str, n: int, timeout_s: float = 120) -> list[int]:
    """Produce timestamps (ms) of the first ``n`` records of ``topic``, all partitions."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("bench-read"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    stamps: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(stamps) < n and time.monotonic() < deadline:
        for m in c.consume(10_000, 0.5):
            if m.error() is None:
                stamps.append(m.timestamp()[1])
    c.close()
    if len(stamps) < n:
        raise RuntimeError(f"only {len(stamps)} of {n} outputs arrived on {topic}")
    return stamps


def output_rate(bootstrap: str, topic: str, n: int) -> float:
    """records/s between the first and the last output's produce timestamp (group joins do not count)."""
    stamps = output_stamps(bootstrap, topic, n)
    return n / max(1e-3, (max(stamps) - min(stamps)) / 1000)
