"""``sluice run --until-end`` on the real broker: a bounded run over a topic ends by itself with exit 0, every
record below the end offsets it took having exactly one output and its offset committed; records produced
after it started are left for the next run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from tests.integration.pipelines import ROOT, run_sluice, write_pipeline
from tests.support.kafka import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.kafka


def topics(bootstrap: str, partitions: int = 3) -> tuple[str, str, str]:
    names = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for name, n in zip(names, (partitions, partitions, 1), strict=True):
        create_topic(bootstrap, name, n)
    return names


def records(start: int, n: int, text: str = "review") -> list[tuple[str, str]]:
    return [(str(i), json.dumps({"seq": i, "text": f"{text} {i}"})) for i in range(start, start + n)]


def seqs(bootstrap: str, topic: str, n: int, isolation: str = "read_uncommitted") -> list[int]:
    return sorted(json.loads(r.value)["seq"] for r in consume_all(bootstrap, topic, expected_count=n,
                                                                  isolation=isolation))


def test_a_10k_record_topic_runs_to_its_end_and_exits_0_with_one_output_each(kafka_bootstrap: str,
                                                                            tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    produce(kafka_bootstrap, t_in, records(0, 10_000))
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq)

    proc = run_sluice("run", str(pipeline), "--until-end", timeout_s=180)  # no --idle-exit: it ends by itself
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seqs(kafka_bootstrap, t_out, 10_000) == list(range(10_000))  # exactly one output per input
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
    assert "done: 10,000 records in" in proc.stderr  # the summary line


@pytest.mark.slow
def test_records_produced_after_the_start_are_left_for_the_next_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    produce(kafka_bootstrap, t_in, records(0, 1500))
    ends_at_start = end_offsets(kafka_bootstrap, t_in)
    group = unique_topic("g")
    # a slow model: the run is still going when the late records arrive
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq,
                              function="tests.integration.funcs:slow_tag",
                              batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(pipeline), "--until-end"], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the end offsets are taken at assignment: produce after that
            seen.append(line)
            if f"--until-end: {t_in}[" in line:
                break
        produce(kafka_bootstrap, t_in, records(1500, 500, text="late"))
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, "".join(seen) + rest[-3000:]
    finally:
        proc.kill()
    assert "done: 1,500 records in" in rest
    assert seqs(kafka_bootstrap, t_out, 1500) == list(range(1500))
    assert committed_offsets(kafka_bootstrap, group, t_in) == ends_at_start  # nothing past the ends it took

    again = run_sluice("run", str(pipeline), "--until-end", timeout_s=120)  # the next run: the late ones
    assert again.returncode == 0, again.stderr[-3000:]
    assert seqs(kafka_bootstrap, t_out, 2000) == list(range(2000))
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


@pytest.mark.slow
def test_exactly_once_over_a_transactional_topic_ends_past_its_commit_markers(kafka_bootstrap: str,
                                                                             tmp_path: Path) -> None:
    """Each transaction of the input ends in a commit marker, an offset no consumer is handed: the run must still
    see its partitions end, and its read_committed output holds every input once."""
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_topic("upstream")})
    producer.init_transactions()
    for chunk in range(4):
        producer.begin_transaction()
        for key, value in records(chunk * 500, 500):
            producer.produce(t_in, value.encode(), key.encode())
        producer.commit_transaction()
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq)
    doc = yaml.safe_load(pipeline.read_text())
    doc["delivery"] = "exactly_once"
    pipeline.write_text(yaml.safe_dump(doc))

    proc = run_sluice("run", str(pipeline), "--until-end", timeout_s=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seqs(kafka_bootstrap, t_out, 2000, isolation="read_committed") == list(range(2000))
    committed = committed_offsets(kafka_bootstrap, group, t_in)
    ends = end_offsets(kafka_bootstrap, t_in)
    # the last offset of each partition is a commit marker: the watermark stops right before it
    assert all(ends[p] - 1 <= committed.get(p, 0) <= ends[p] for p in ends)
