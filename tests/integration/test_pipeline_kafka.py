"""The operator end to end on the real broker: `sluice run` as a user runs it, checked with plain clients."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.integration.pipelines import ROOT, run_sluice, write_pipeline
from tests.support.kafka import (
    ConsumedRecord,
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.kafka


def headers_of(record: ConsumedRecord) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in record.headers}


def topics(bootstrap: str, partitions: int = 3) -> tuple[str, str, str]:
    names = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    create_topic(bootstrap, names[0], partitions)
    create_topic(bootstrap, names[1], partitions)
    create_topic(bootstrap, names[2], 1)
    return names


def test_10k_records_flow_with_keys_order_and_commits(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    n = 10_000
    records = [(f"user-{i % 97}", json.dumps({"seq": i, "text": f"review number {i}"})) for i in range(n)]
    produce(kafka_bootstrap, t_in, records)
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq)

    proc = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = consume_all(kafka_bootstrap, t_out, expected_count=n)
    assert len(out) == n  # exactly once per input on a clean run
    seen = set()
    for rec in out:
        doc = json.loads(rec.value)
        assert doc["tagged"] == f"<REVIEW NUMBER {doc['seq']}>"
        assert rec.key == f"user-{doc['seq'] % 97}".encode()  # key kept
        seen.add(doc["seq"])
    assert seen == set(range(n))
    # per input partition, outputs keep input order (within each output partition they leave in order)
    by_source: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rec in out:
        h = headers_of(rec)
        assert h["sluice.source.topic"] == t_in
        by_source[(rec.partition, int(h["sluice.source.partition"]))].append(int(h["sluice.source.offset"]))
    for offsets in by_source.values():
        assert offsets == sorted(offsets)
    assert consume_all(kafka_bootstrap, t_dlq) == []
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


def test_malformed_records_go_to_the_dead_letter_topic_and_the_rest_flow(kafka_bootstrap: str,
                                                                         tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap, partitions=1)
    good = [(f"k{i}", json.dumps({"text": f"fine {i}"})) for i in range(50)]
    bad = [
        ("bad-json", b"{not json", [("trace", b"abc")]),
        ("no-field", json.dumps({"body": "where is text?"}).encode(), []),
        ("not-object", b"[1, 2, 3]", []),
        ("tombstone", None, []),
        ("bad-utf8", b"\xff\xfe{", []),
    ]
    mixed: list = good[:20] + bad[:2] + good[20:40] + bad[2:] + good[40:]
    offsets = produce(kafka_bootstrap, t_in, mixed)
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq)

    proc = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = consume_all(kafka_bootstrap, t_out, expected_count=50)
    assert sorted(json.loads(r.value)["text"] for r in out) == sorted(f"fine {i}" for i in range(50))
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=5)
    by_key = {r.key.decode(): r for r in dlq}
    assert set(by_key) == {"bad-json", "no-field", "not-object", "tombstone", "bad-utf8"}
    offset_of = {rec[0]: off for rec, (_, off) in zip(mixed, offsets, strict=True)}
    for key, original in ((b[0], b[1]) for b in bad):
        rec = by_key[key]
        h = headers_of(rec)
        assert rec.value == original  # original bytes kept
        assert h["sluice.error.stage"] == "decode"
        assert h["sluice.error.topic"] == t_in
        assert h["sluice.error.partition"] == "0"
        assert h["sluice.error.offset"] == str(offset_of[key])
        assert h["sluice.error.class"] == "CodecError"
    assert "not valid JSON" in headers_of(by_key["bad-json"])["sluice.error.message"]
    assert "no field 'text'" in headers_of(by_key["no-field"])["sluice.error.message"]
    assert headers_of(by_key["bad-json"])["trace"] == "abc"  # original headers kept
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


def test_engine_failures_are_isolated_by_bisecting(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap, partitions=1)
    texts = [("poison pill" if i in (7, 130, 131) else f"ok {i}") for i in range(200)]
    produce(kafka_bootstrap, t_in, [(str(i), json.dumps({"text": t})) for i, t in enumerate(texts)])
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, unique_topic("g"), dlq=t_dlq,
                              function="tests.integration.funcs:fail_on_poison",
                              batching={"max_batch_size": 64, "max_queue_delay_ms": 50})
    proc = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(consume_all(kafka_bootstrap, t_out, expected_count=197)) == 197
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=3)
    assert sorted(int(r.key) for r in dlq) == [7, 130, 131]
    assert all(headers_of(r)["sluice.error.stage"] == "infer" for r in dlq)
    assert all("cannot digest" in headers_of(r)["sluice.error.message"] for r in dlq)


def test_without_a_dead_letter_topic_a_bad_record_stops_the_operator_uncommitted(kafka_bootstrap: str,
                                                                                  tmp_path: Path) -> None:
    t_in, t_out, _ = topics(kafka_bootstrap, partitions=1)
    records = [(str(i), json.dumps({"text": str(i)})) for i in range(30)]
    records[12] = ("12", "{broken")
    produce(kafka_bootstrap, t_in, records)
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group)
    proc = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "@12 failed at decode" in proc.stderr and "dead_letter" in proc.stderr
    assert committed_offsets(kafka_bootstrap, group, t_in).get(0, 0) <= 12


def test_sigterm_mid_stream_then_restart_loses_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    n = 4000
    produce(kafka_bootstrap, t_in, [(f"k{i}", json.dumps({"seq": i, "text": f"t{i}"})) for i in range(n)])
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq,
                              function="tests.integration.funcs:slow_tag",
                              batching={"max_batch_size": 32, "max_queue_delay_ms": 5},
                              runtime={"max_in_flight": 200, "commit_interval_ms": 200, "drain_timeout_s": 20})
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(pipeline)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until it is mid-stream
            produced = sum(end_offsets(kafka_bootstrap, t_out).values())
            if produced >= 500:
                break
            time.sleep(0.2)
        assert produced < n, "too fast to interrupt mid-stream"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "SIGTERM received" in stderr
    first_run = consume_all(kafka_bootstrap, t_out)
    committed = committed_offsets(kafka_bootstrap, group, t_in)
    # the drain finished what was in flight and committed exactly what it produced
    assert sum(committed.values()) == len(first_run) < n

    proc2 = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    out = consume_all(kafka_bootstrap, t_out, expected_count=n)
    seqs = [json.loads(r.value)["seq"] for r in out]
    assert set(seqs) == set(range(n))  # every input has an output
    assert len(seqs) == n  # a graceful stop commits everything it produced: no duplicates at all
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


def test_results_too_large_for_the_output_topic_are_dead_lettered(kafka_bootstrap: str, tmp_path: Path) -> None:
    t_in, t_out, t_dlq = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    create_topic(kafka_bootstrap, t_in, 1)
    create_topic(kafka_bootstrap, t_out, 1, config={"max.message.bytes": "20000"})
    create_topic(kafka_bootstrap, t_dlq, 1)
    texts = ["big one" if i % 10 == 3 else f"small {i}" for i in range(100)]
    produce(kafka_bootstrap, t_in, [(str(i), json.dumps({"text": t})) for i, t in enumerate(texts)])
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, group, dlq=t_dlq,
                              function="tests.integration.funcs:inflate")
    proc = run_sluice("run", str(pipeline), "--idle-exit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(consume_all(kafka_bootstrap, t_out, expected_count=90)) == 90
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=10)
    assert sorted(int(r.key) for r in dlq) == [i for i in range(100) if i % 10 == 3]
    h = headers_of(dlq[0])
    assert h["sluice.error.stage"] == "produce" and h["sluice.error.class"] == "OversizedResult"
    assert "accepts at most" in h["sluice.error.message"]
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
