"""``sluice run`` against the real broker, read as a new user reads its stderr: every librdkafka line goes
through the log (none printed raw as ``%6|...``), a first start under static membership does not say it
was restarted, and the run ends with one summary line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.pipelines import run_sluice, write_pipeline
from tests.support.kafka import create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka


def test_a_first_start_prints_nothing_raw_claims_no_restart_and_ends_in_one_summary(kafka_bootstrap: str,
                                                                                    tmp_path: Path) -> None:
    t_in, t_out, t_dlq = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for topic in (t_in, t_out, t_dlq):
        create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, t_in, [(f"k{i}", json.dumps({"text": f"review {i}"})) for i in range(200)])
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, unique_topic("g"), dlq=t_dlq)
    # librdkafka's debug lines for the admin lookups come for sure: without a logger they print as %7|...
    proc = run_sluice("run", str(pipeline), "--max-records", "200", "--idle-exit", "1",
                      "--set", "sink.kafka.config.debug=admin", timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert [line for line in lines if line.startswith("%")] == []
    (membership,) = [line for line in lines if "static group membership as" in line]
    assert "restarted" not in membership  # a fresh group: nobody held this id
    (summary,) = [line for line in lines if "done: " in line or "stopped: " in line]
    assert "done: 200 records in " in summary and "| 200 in, " in summary
