"""The sink's admin lookup (a topic's max.message.bytes) logs through Python logging like every other client:
librdkafka's lines reach ``sluice.librdkafka.admin`` at their own level, and none is printed raw on stderr
(``%6|...|BGQUEUE|...`` at every start was the issue)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sluice.connectors.kafka import admin
from sluice.connectors.kafka.admin import TopicLimits
from tests.support.kafka import create_topic, unique_topic


class _FakeAdmin:
    made: list[_FakeAdmin] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf, self.polls = conf, 0
        _FakeAdmin.made.append(self)

    def describe_configs(self, resources: list[Any]) -> dict[Any, Any]:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        future.set_result({"max.message.bytes": type("Entry", (), {"value": "2000000"})()})
        return {resources[0]: future}

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def test_the_admin_client_gets_sluices_librdkafka_logger_and_is_polled_before_it_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "AdminClient", _FakeAdmin)
    _FakeAdmin.made.clear()
    limit = TopicLimits({"bootstrap.servers": "b:9092", "logger": "the producer's", "acks": "all"})
    assert limit.max_message_bytes("out") == 1_000_000 - admin.RECORD_OVERHEAD_BYTES
    (client,) = _FakeAdmin.made
    assert isinstance(client.conf["logger"], logging.Logger)
    assert client.conf["logger"].name == "sluice.librdkafka.admin"
    assert "acks" not in client.conf
    assert client.polls >= 1  # queued log lines are handed over only on a poll


@pytest.mark.kafka
def test_librdkafka_lines_of_the_lookup_go_through_logging_never_raw_to_stderr(
        kafka_bootstrap: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    topic = unique_topic("limits")
    create_topic(kafka_bootstrap, topic, 1)
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="sluice.librdkafka.admin"):
        # librdkafka's debug lines come for sure; without a logger it prints them on stderr as %7|...
        limit = TopicLimits({"bootstrap.servers": kafka_bootstrap, "debug": "admin,broker"})
        assert limit.max_message_bytes(topic) > 0
    raw = [line for line in capfd.readouterr().err.splitlines() if line.startswith("%")]
    assert raw == []
    lines = [r for r in caplog.records if r.name == "sluice.librdkafka.admin"]
    assert lines and {r.levelno for r in lines} == {logging.DEBUG}
