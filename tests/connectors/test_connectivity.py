"""Broker connectivity logged by change (sluice/connectors/kafka/connectivity.py) and the statistics that
say the brokers are back (statistics.py)."""

from __future__ import annotations

import json
import logging

import pytest

from sluice.connectors.kafka.connectivity import ConnectivityLog, QuietConnectionLines
from sluice.connectors.kafka.statistics import read_statistics
from sluice.operator.record import TopicPartition


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_one_line_down_a_summary_every_30_s_and_one_line_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("test.connectivity")
    conn = ConnectivityLog("kafka producer", logger, clock)
    conn.reachable()  # never down: nothing to say
    with caplog.at_level(logging.INFO, logger="test.connectivity"):
        for _ in range(400):  # 40 errors a second for 10 s, then on to 65 s
            conn.error("1/1 brokers are down")
            clock.now += 0.025
        while clock.now < 65:
            conn.error("Connect to ipv4#127.0.0.1:9092 failed: Connection refused")
            clock.now += 0.5
        conn.reachable()
        conn.reachable()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("kafka producer: lost the brokers: 1/1 brokers are down (retrying; one line every 30 s "
                        "while down)")
    summaries = [line.split(" (")[0] for line in lines[1:3]]
    assert summaries[0] in ("kafka producer: brokers still unreachable after 30 s",
                            "kafka producer: brokers still unreachable after 31 s")  # at the next error past 30 s
    assert summaries[1].removesuffix(" s").rsplit(" ", 1)[1] in ("60", "61")
    assert lines[3] == "kafka producer: brokers reachable again after 65 s"
    assert len(lines) == 4 and not conn.is_down


def test_librdkafka_connection_failures_go_to_debug_and_other_lines_pass() -> None:
    quiet = QuietConnectionLines()
    fail = logging.LogRecord("sluice.librdkafka.consumer", logging.ERROR, "", 0, "%s [%s] %s",
                             ("FAIL", "rdkafka#consumer-1", "Connect failed"), None)
    assert quiet.filter(fail) is False and fail.levelno == logging.DEBUG  # not shown at the default level
    other = logging.LogRecord("sluice.librdkafka.consumer", logging.WARNING, "", 0, "%s [%s] %s",
                              ("SESSTMOUT", "rdkafka#consumer-1", "session timed out"), None)
    assert quiet.filter(other) is True and other.levelno == logging.WARNING


def test_statistics_give_the_lag_and_whether_a_real_broker_is_up() -> None:
    doc = {"brokers": {"127.0.0.1:9092/bootstrap": {"state": "UP", "nodeid": -1},
                       "127.0.0.1:9092/1": {"state": "DOWN", "nodeid": 1}},
           "topics": {"in": {"partitions": {"0": {"consumer_lag": 7}, "1": {"consumer_lag": -1},
                                            "-1": {"consumer_lag": 3}}}}}
    stats = read_statistics(json.dumps(doc))
    assert stats.lag == {TopicPartition("in", 0): 7} and not stats.broker_up  # the bootstrap entry is no broker
    doc["brokers"]["127.0.0.1:9092/1"]["state"] = "UP"  # type: ignore[index]
    assert read_statistics(json.dumps(doc)).broker_up
    assert read_statistics("{not json") == read_statistics("{}")
