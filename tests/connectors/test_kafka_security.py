"""Secured Kafka: the pipeline's ``security`` section reaches librdkafka (SASL PLAIN / SCRAM, TLS), the
sink inherits it on the source's cluster, and the password never shows up in what Sluice prints.

The broker is the real one, started with SASL_PLAINTEXT and SASL_SSL listeners (``kafka.sh start --tls``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, Producer

from sluice.config import ConfigError, parse_pipeline
from sluice.connectors.kafka import KafkaSink, security_config
from tests.integration.pipelines import run_sluice
from tests.support.kafka import SecuredListeners, consume_all, create_topic, produce, unique_topic

PASSWORD = "s3cret-" + uuid.uuid4().hex  # a value no other text in a log can match by chance


def _doc(security: dict[str, Any] | None, sink: dict[str, Any] | None = None,
         bootstrap: str = "127.0.0.1:1", topic_in: str = "in", topic_out: str = "out",
         group: str = "g") -> dict[str, Any]:
    source: dict[str, Any] = {"bootstrap_servers": bootstrap, "topics": [topic_in], "group_id": group}
    if security is not None:
        source["security"] = security
    return {
        "name": "secured",
        "source": {"kafka": source},
        "engine": {"type": "python", "function": "tests.integration.funcs:tag"},
        "sink": {"kafka": {"topic": topic_out, **(sink or {})}, "output": {"field": "tagged"}},
        "runtime": {"commit_interval_ms": 200, "drain_timeout_s": 10},
    }


def _sasl(mechanism: str, username: str = "sluice", password: str = "${KAFKA_PASSWORD}") -> dict[str, Any]:
    return {"mechanism": mechanism, "username": username, "password": password}


# ------------------------------------------------------------------------------ config -> librdkafka


def test_security_section_becomes_librdkafka_settings_and_the_sink_inherits_it() -> None:
    doc = _doc({"sasl": _sasl("SCRAM-SHA-512"), "tls": {"ca_location": "ca.pem"}})
    p = parse_pipeline(yaml.safe_dump(doc), environ={"KAFKA_PASSWORD": PASSWORD}).pipeline

    conf = security_config(p.source.kafka.security)
    assert conf == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "sluice",
                    "sasl.password": PASSWORD, "ssl.ca.location": "ca.pem",
                    "ssl.endpoint.identification.algorithm": "https"}
    assert security_config(p.sink.kafka.security) == conf  # same cluster, same credentials

    sasl_only = parse_pipeline(yaml.safe_dump(_doc({"sasl": _sasl("PLAIN")})), environ={"KAFKA_PASSWORD": "x"})
    assert security_config(sasl_only.pipeline.source.kafka.security)["security.protocol"] == "SASL_PLAINTEXT"
    tls_only = parse_pipeline(yaml.safe_dump(_doc({"tls": {"verify_hostname": False}}))).pipeline
    assert security_config(tls_only.source.kafka.security) == {
        "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}
    assert security_config(parse_pipeline(yaml.safe_dump(_doc(None))).pipeline.source.kafka.security) == {}


def test_a_sink_on_another_cluster_never_gets_the_source_credentials() -> None:
    doc = _doc({"sasl": _sasl("PLAIN")}, sink={"bootstrap_servers": "elsewhere:9092"})
    p = parse_pipeline(yaml.safe_dump(doc), environ={"KAFKA_PASSWORD": PASSWORD}).pipeline
    assert p.sink.kafka.security is None


def test_security_mistakes_are_one_line_errors_that_never_echo_the_password() -> None:
    bad = _doc({"sasl": {"mechanism": "SCRAM-SHA-1", "username": "u", "password": [PASSWORD]}},
               sink={"config": {"sasl.password": [PASSWORD]}})
    with pytest.raises(ConfigError) as err:
        parse_pipeline(yaml.safe_dump(bad))
    message = str(err.value)
    assert "source.kafka.security.sasl.mechanism" in message and "SCRAM-SHA-512" in message
    assert "source.kafka.security.sasl.password" in message
    assert PASSWORD not in message

    with pytest.raises(ConfigError, match="KAFKA_PASSWORD is not set"):
        parse_pipeline(yaml.safe_dump(_doc({"sasl": _sasl("PLAIN")})), environ={})
    with pytest.raises(ConfigError, match="give 'sasl', 'tls' or both"):
        parse_pipeline(yaml.safe_dump(_doc({})))


def test_the_validated_pipeline_prints_the_password_masked() -> None:
    doc = _doc({"sasl": _sasl("SCRAM-SHA-256"), "tls": {"key_password": "${KAFKA_PASSWORD}",
                                                        "certificate_location": "c.pem", "key_location": "k.pem"}})
    loaded = parse_pipeline(yaml.safe_dump(doc), environ={"KAFKA_PASSWORD": PASSWORD})
    shown = [repr(loaded), str(loaded.pipeline), loaded.pipeline.model_dump_json()]
    assert all(PASSWORD not in text for text in shown)
    assert "**********" in shown[0]


# ------------------------------------------------------------------------------ against the broker


@pytest.mark.kafka
@pytest.mark.parametrize(("mechanism", "tls"), [("PLAIN", False), ("SCRAM-SHA-256", False),
                                                ("SCRAM-SHA-512", False), ("SCRAM-SHA-512", True)])
def test_the_sink_authenticates_with_each_mechanism(kafka_secured: SecuredListeners, mechanism: str,
                                                    tls: bool) -> None:
    creds = kafka_secured.client_config("SCRAM-SHA-256")
    topic = unique_topic(f"sasl-{mechanism.lower()}")
    create_topic(creds["bootstrap.servers"], topic, 1, client=creds)
    security: dict[str, Any] = {"sasl": _sasl(mechanism, kafka_secured.username)}
    bootstrap = kafka_secured.sasl_bootstrap
    if tls:
        security["tls"] = {"ca_location": kafka_secured.ca_location}
        bootstrap = kafka_secured.tls_bootstrap or ""
    doc = _doc(security, bootstrap=bootstrap, topic_out=topic)
    p = parse_pipeline(yaml.safe_dump(doc), environ={"KAFKA_PASSWORD": kafka_secured.password}).pipeline

    sink = KafkaSink(bootstrap, p.sink.kafka)
    errors: list[KafkaError | None] = []
    sink.produce(topic, b"hello", None, [], lambda err, _msg: errors.append(err))
    assert sink.flush(20) == 0 and errors == [None]
    got = consume_all(creds["bootstrap.servers"], topic, expected_count=1, client=creds)
    assert [r.value for r in got] == [b"hello"]


@pytest.mark.kafka
def test_the_secured_listener_refuses_a_wrong_password(kafka_secured: SecuredListeners) -> None:
    """The counter-check of the test above: these listeners really do authenticate."""
    creds = kafka_secured.client_config("SCRAM-SHA-256")
    topic = unique_topic("sasl-refused")
    create_topic(creds["bootstrap.servers"], topic, 1, client=creds)
    producer = Producer({**kafka_secured.client_config("SCRAM-SHA-256", password="wrong-" + PASSWORD),
                         "message.timeout.ms": 1500, "log_level": 0})
    errors: list[KafkaError | None] = []
    producer.produce(topic, b"never", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(10)
    assert len(errors) == 1 and errors[0] is not None


@pytest.mark.kafka
def test_sluice_run_over_sasl_ssl_processes_every_record_and_never_logs_the_password(
        kafka_secured: SecuredListeners, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = kafka_secured.client_config("SCRAM-SHA-512", tls=True)
    bootstrap = creds["bootstrap.servers"]
    topic_in, topic_out = unique_topic("sasl-in"), unique_topic("sasl-out")
    for topic in (topic_in, topic_out):
        create_topic(bootstrap, topic, 2, client=creds)
    n = 300
    produce(bootstrap, topic_in, [(f"k{i}", json.dumps({"seq": i, "text": f"t{i}"})) for i in range(n)], config=creds)
    security = {"sasl": _sasl("SCRAM-SHA-512", kafka_secured.username),
                "tls": {"ca_location": kafka_secured.ca_location}}
    doc = _doc(security, bootstrap=bootstrap, topic_in=topic_in, topic_out=topic_out, group=unique_topic("g"))
    # librdkafka's own configuration dump and security debugging on: everything it could print, it prints.
    doc["source"]["kafka"]["config"] = {"debug": "security,conf"}
    pipeline = tmp_path / "secured.yaml"
    pipeline.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KAFKA_PASSWORD", kafka_secured.password)  # as a Kubernetes Secret would set it
    validate = run_sluice("validate", str(pipeline), timeout_s=60)
    run = run_sluice("--log-level", "debug", "run", str(pipeline), "--idle-exit", "2", timeout_s=120)
    assert validate.returncode == 0, validate.stderr
    assert run.returncode == 0, run.stderr[-3000:]

    out = consume_all(bootstrap, topic_out, expected_count=n, client=creds)
    assert sorted(json.loads(r.value)["seq"] for r in out) == list(range(n))
    printed = validate.stdout + validate.stderr + run.stdout + run.stderr
    assert "sasl.password" in printed  # librdkafka's configuration dump really was printed...
    assert kafka_secured.password not in printed  # ...and the password was not in it
