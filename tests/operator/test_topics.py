"""The start-time topic check on the real broker: a missing topic stops `sluice run` before the engine
loads, with one line naming each missing topic, its setting and how to create it."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sluice.config import LoadedPipeline, parse_pipeline
from sluice.operator.topics import TopicProblem, check_topics, needed_topics
from tests.support.kafka import SecuredListeners, create_topic, unique_topic

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kafka


def pipeline(bootstrap: str, t_in: str, t_out: str, t_dlq: str, **kafka: object) -> dict[str, object]:
    return {"source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [t_in], "group_id": "g", **kafka}},
            # an engine that cannot load: reaching it would print a different error
            "engine": {"type": "llm", "model": "/no/such/model.gguf"},
            "sink": {"kafka": {"topic": t_out}}, "dead_letter": {"topic": t_dlq}}


def loaded(doc: dict[str, object]) -> LoadedPipeline:
    return parse_pipeline(yaml.safe_dump(doc), environ={})


def test_sluice_run_names_every_missing_topic_before_the_engine_loads(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    create_topic(kafka_bootstrap, t_in, 1)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pipeline(kafka_bootstrap, t_in, t_out, t_dlq)))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "run", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("sluice:")]
    assert line.startswith("sluice: cannot start: on the Kafka brokers at " + kafka_bootstrap)
    assert f"topic {t_out} (sink.kafka.topic) does not exist" in line
    assert f"topic {t_dlq} (dead_letter.topic) does not exist" in line
    assert t_in not in line
    assert f"kafka-topics.sh --bootstrap-server {kafka_bootstrap} --create --topic {t_out}" in line
    assert "model" not in proc.stderr and "Traceback" not in proc.stderr
    assert elapsed < 30, f"{elapsed:.1f} s"


def test_existing_topics_pass_and_a_missing_input_is_named(kafka_bootstrap: str) -> None:
    t_in, t_out, t_dlq = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for name in (t_in, t_out, t_dlq):
        create_topic(kafka_bootstrap, name, 1)
    check_topics(loaded(pipeline(kafka_bootstrap, t_in, t_out, t_dlq)).pipeline)
    missing = unique_topic("gone")
    with pytest.raises(TopicProblem, match=f"topic {missing} \\(source.kafka.topics\\) does not exist"):
        check_topics(loaded(pipeline(kafka_bootstrap, missing, t_out, t_dlq)).pipeline)
    # asking did not create it (the broker creates topics on metadata requests only when asked to)
    with pytest.raises(TopicProblem, match=missing):
        check_topics(loaded(pipeline(kafka_bootstrap, missing, t_out, t_dlq)).pipeline)


def test_unreachable_brokers_are_a_warning_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="sluice.operator.topics"):
        check_topics(loaded(pipeline(f"127.0.0.1:{port}", "a", "b", "c")).pipeline, timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert "cannot check the topics" in caplog.text and "starting anyway" in caplog.text


def test_refused_credentials_stop_it_with_the_brokers_reason(kafka_secured: SecuredListeners) -> None:
    security = {"sasl": {"mechanism": "SCRAM-SHA-256", "username": kafka_secured.username, "password": "wrong"}}
    doc = pipeline(kafka_secured.sasl_bootstrap, "a", "b", "c", security=security)
    with pytest.raises(TopicProblem, match="refused this client: .*[Aa]uthentication"):
        check_topics(loaded(doc).pipeline)


def test_each_topic_is_checked_once_under_its_first_setting() -> None:
    doc = pipeline("h:1", "same", "same", "dlq")
    uses = needed_topics(loaded(doc).pipeline)
    assert [(u.name, u.setting, u.writes) for u in uses] == [("same", "source.kafka.topics", True),
                                                             ("dlq", "dead_letter.topic", True)]
