"""Whether a start under a static group.instance.id is a restart: only when the group still holds a member of
that id (issue: a first start said it was "restarted under this id")."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer

from sluice.connectors.kafka.membership import admin_config, holds, membership_line, static_member_present
from tests.support.kafka import create_topic, unique_topic


def test_a_restart_is_said_only_when_the_group_holds_the_id() -> None:
    assert membership_line("sluice-g-host-0", None) == "static group membership as sluice-g-host-0"
    assert membership_line("sluice-g-host-0", False) == "static group membership as sluice-g-host-0"
    assert "restarted under this id" in membership_line("sluice-g-host-0", True)
    group = SimpleNamespace(members=[SimpleNamespace(group_instance_id=None),
                                     SimpleNamespace(group_instance_id="sluice-g-host-1")])
    assert holds(group, "sluice-g-host-1") and not holds(group, "sluice-g-host-0")
    assert not holds(SimpleNamespace(members=[]), "sluice-g-host-0")


def test_the_admin_client_takes_only_how_to_reach_the_brokers() -> None:
    conf = admin_config({"bootstrap.servers": "b:9092", "group.id": "g", "session.timeout.ms": 6000,
                         "security.protocol": "SASL_SSL", "sasl.username": "u", "ssl.ca.location": "/ca.pem"})
    assert set(conf) == {"bootstrap.servers", "security.protocol", "sasl.username", "ssl.ca.location", "logger"}
    assert conf["logger"].name == "sluice.librdkafka.admin"


def test_no_broker_answering_is_not_known_and_claims_nothing() -> None:
    started = time.monotonic()
    assert static_member_present({"bootstrap.servers": "127.0.0.1:1"}, "g", "i", timeout_s=0.5) is None
    assert time.monotonic() - started < 5


@pytest.mark.kafka
def test_a_fresh_group_holds_no_member_and_a_static_member_gone_without_leaving_is_still_held(
        kafka_bootstrap: str) -> None:
    topic, group, member = unique_topic("static"), unique_topic("g"), unique_topic("member")
    create_topic(kafka_bootstrap, topic, 1)
    conf = {"bootstrap.servers": kafka_bootstrap}
    # a first start; on a fresh broker the group coordinator answers NOT_COORDINATOR (unknown) for a moment
    deadline = time.monotonic() + 30
    while (present := static_member_present(conf, group, member)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert present is False
    consumer = Consumer({**conf, "group.id": group, "group.instance.id": member, "session.timeout.ms": 45000})
    assigned: list[object] = []
    consumer.subscribe([topic], on_assign=lambda _c, tps: assigned.extend(tps))
    deadline = time.monotonic() + 30
    while not assigned and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert assigned, "the static member was never assigned its partition"
    consumer.close()  # a static member's close does not leave the group (KIP-345): as after a crash
    assert static_member_present(conf, group, member) is True  # a restart under this id now
    assert static_member_present(conf, group, unique_topic("other")) is False
