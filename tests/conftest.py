"""Fixtures shared by the whole test suite. Keep each fixture small; helpers live in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.kafka import KafkaCluster

# ---------------------------------------------------------------- Kafka


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a real broker for the whole session.

    SLUICE_KAFKA_BOOTSTRAP=host:port uses an existing broker (left running afterwards); otherwise a
    single-node broker is started with deploy/kafka/kafka.sh in a tmp dir and stopped at session end.
    If it cannot start, tests using it error with the script's log tail in the message.
    """
    external = os.environ.get("SLUICE_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    cluster = KafkaCluster.start(tmp_path_factory.mktemp("kafka"), num_nodes=1)
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A fresh 3-node cluster (replication 3, min.insync.replicas 2) for failure tests in one module."""
    cluster = KafkaCluster.start(tmp_path_factory.mktemp("kafka3"), num_nodes=3)
    try:
        yield cluster
    finally:
        cluster.stop()
