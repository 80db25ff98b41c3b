"""LLM enrichment from Kafka with continuous batching, on the real broker with the real SmolLM2-135M."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sluice.model_store import fetch
from tests.integration.pipelines import ROOT, run_sluice
from tests.support.kafka import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.kafka

REVIEWS = ["Arrived quickly and works exactly as described.", "The battery died after two days.",
           "Great value for the price, would buy again!", "Meh. It does the job.", "Terrible customer service.",
           "I love the colour and the fabric feels premium.", "Smaller than it looks in the photos.",
           "Five stars.", "Stopped working after the update.", "Perfect gift for my dad"]


@pytest.fixture(scope="module")
def smollm() -> Path:
    return fetch("smollm2-135m")


def pipeline(path: Path, bootstrap: str, t_in: str, t_out: str, t_dlq: str, group: str, **engine: object) -> Path:
    doc = {
        "source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [t_in], "group_id": group,
                             "config": {"session.timeout.ms": 6000}}},
        "codec": {"format": "json", "input_field": "."},
        "engine": {"type": "llm", "model": "smollm2-135m", "num_threads": 2, "max_num_seqs": 32,
                   "system_prompt": "You are a sentiment classifier. Answer with one word: positive, negative "
                                    "or neutral.",
                   "user_template": "Review: {text}\nSentiment:", "max_tokens": 4, "max_model_len": 256,
                   **engine},
        "sink": {"kafka": {"topic": t_out}, "output": {"field": "label"}},
        "dead_letter": {"topic": t_dlq},
        "runtime": {"commit_interval_ms": 200, "drain_timeout_s": 1},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def signal_after_outputs(path: Path, bootstrap: str, t_out: str, outputs: int, sig: int) -> tuple[int, str]:
    """Run the pipeline until ``outputs`` records are on ``t_out`` (at most 300 s), send ``sig``; return the
    exit status and standard error."""
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while sum(end_offsets(bootstrap, t_out).values()) < outputs and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def topics(bootstrap: str) -> tuple[str, str, str]:
    names = unique_topic("reviews"), unique_topic("labelled"), unique_topic("dlq")
    for name, parts in zip(names, (2, 2, 1), strict=True):
        create_topic(bootstrap, name, parts)
    return names


def test_200_reviews_get_labels_and_unfit_prompts_are_dead_lettered(kafka_bootstrap: str, tmp_path: Path,
                                                                    smollm: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    records = [(f"r{i}", json.dumps({"id": i, "text": REVIEWS[i % len(REVIEWS)]})) for i in range(200)]
    too_long = [(f"long{i}", json.dumps({"id": 1000 + i, "text": "very long review " * 120})) for i in range(3)]
    produce(kafka_bootstrap, t_in, records[:100] + too_long + records[100:])
    group = unique_topic("g")
    path = pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, t_dlq, group)
    proc = run_sluice("run", str(path), "--idle-exit", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = consume_all(kafka_bootstrap, t_out, expected_count=200, timeout_s=60)
    labels = {json.loads(r.value)["id"]: json.loads(r.value)["label"] for r in out}
    assert sorted(labels) == list(range(200))
    assert all(isinstance(label, str) and label.strip() for label in labels.values())
    # greedy decoding: the same review gets the same label whatever else shared its batch
    for i in range(len(REVIEWS), 200):
        assert labels[i] == labels[i % len(REVIEWS)]
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=3)
    assert sorted(r.key for r in dlq) == [b"long0", b"long1", b"long2"]
    for r in dlq:
        h = {k: v.decode() for k, v in r.headers}
        assert h["sluice.error.stage"] == "prepare"
        assert "the model's context holds 256" in h["sluice.error.message"]
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
    assert "prefix-cache hit rate" in proc.stderr


def test_answers_that_are_not_the_json_asked_for_are_dead_lettered_with_the_answer(
        kafka_bootstrap: str, tmp_path: Path, smollm: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    # max_len 1: the answer is cut after one token, which cannot be a JSON object with a label
    records = [(f"r{i}", json.dumps({"text": REVIEWS[i], "max_len": 1 if i % 2 else 24})) for i in range(10)]
    produce(kafka_bootstrap, t_in, records)
    schema = {"type": "object", "required": ["label"]}
    path = pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, t_dlq, unique_topic("g"),
                    parse="json", json_schema=schema, overrides={"max_tokens": "max_len"},
                    system_prompt='Reply with JSON only, like {"label": "positive"}.', user_template="{text}")
    proc = run_sluice("run", str(path), "--idle-exit", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = consume_all(kafka_bootstrap, t_out)
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=5)
    assert len(out) + len(dlq) == 10
    for r in out:
        assert isinstance(json.loads(r.value)["label"], dict) and "label" in json.loads(r.value)["label"]
    odd = {f"r{i}".encode() for i in range(1, 10, 2)}
    assert odd <= {r.key for r in dlq}
    for r in dlq:
        h = {k: v.decode() for k, v in r.headers}
        assert h["sluice.error.class"] == "AnswerError"
        assert "not valid JSON" in h["sluice.error.message"] or "does not match json_schema" in h["sluice.error.message"]
        assert "answer: " in h["sluice.error.message"]


def test_sigterm_mid_generation_commits_only_finished_records(kafka_bootstrap: str, tmp_path: Path,
                                                              smollm: Path) -> None:
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    n = 120
    produce(kafka_bootstrap, t_in, [(f"r{i}", json.dumps({"id": i, "text": REVIEWS[i % 10]})) for i in range(n)])
    group = unique_topic("g")
    path = pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, t_dlq, group, max_tokens=24, stop=[],
                    max_num_seqs=8)
    returncode, stderr = signal_after_outputs(path, kafka_bootstrap, t_out, 10, signal.SIGTERM)
    assert returncode == 0, stderr[-3000:]
    first = consume_all(kafka_bootstrap, t_out)
    assert len(first) < n, "everything finished before SIGTERM: nothing was mid-generation"
    done = {json.loads(r.value)["id"] for r in first}
    committed = committed_offsets(kafka_bootstrap, group, t_in)
    inputs = consume_all(kafka_bootstrap, t_in)
    for rec in inputs:  # every input below the committed offset has its output
        if rec.offset < committed.get(rec.partition, 0):
            assert json.loads(rec.value)["id"] in done

    proc2 = run_sluice("run", str(path), "--idle-exit", "8")
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    ids = {json.loads(r.value)["id"] for r in consume_all(kafka_bootstrap, t_out, expected_count=n)}
    assert ids == set(range(n))
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)


def test_kill_9_mid_stream_duplicates_are_byte_identical_to_their_originals(kafka_bootstrap: str, tmp_path: Path,
                                                                           smollm: Path) -> None:  # fmt: skip
    """Sampled answers (temperature 0.9, seeded from each record's offset by default) under at-least-once: the
    process is killed with SIGKILL before its first commit, so every answer it wrote is written again by the
    next run -- computed in other batches, beside other records -- and must be the same bytes."""
    t_in, t_out, t_dlq = topics(kafka_bootstrap)
    n = 60
    produce(kafka_bootstrap, t_in, [(f"r{i}", json.dumps({"id": i, "text": REVIEWS[i % 10]})) for i in range(n)])
    group = unique_topic("g")
    path = pipeline(tmp_path / "p.yaml", kafka_bootstrap, t_in, t_out, t_dlq, group, max_tokens=16, stop=[],
                    temperature=0.9, top_p=0.95, max_num_seqs=6)  # fmt: skip
    doc = yaml.safe_load(path.read_text())
    doc["runtime"]["commit_interval_ms"] = 600_000  # nothing committed before the kill
    path.write_text(yaml.safe_dump(doc))
    signal_after_outputs(path, kafka_bootstrap, t_out, 12, signal.SIGKILL)
    first = consume_all(kafka_bootstrap, t_out)
    assert 12 <= len(first) < n, "the kill came after every answer was written"
    doc["runtime"]["commit_interval_ms"] = 200
    path.write_text(yaml.safe_dump(doc))
    again = run_sluice("run", str(path), "--idle-exit", "8")
    assert again.returncode == 0, again.stderr[-3000:]
    outputs = consume_all(kafka_bootstrap, t_out, expected_count=n + len(first))
    by_id: dict[int, set[bytes]] = {}
    for r in outputs:
        by_id.setdefault(json.loads(r.value)["id"], set()).add(bytes(r.value))
    assert sorted(by_id) == list(range(n))
    duplicated = [i for i in by_id if sum(json.loads(r.value)["id"] == i for r in outputs) > 1]
    assert len(duplicated) >= len(first)  # every answer of the killed run was written again
    assert all(len(values) == 1 for values in by_id.values()), {i: v for i, v in by_id.items() if len(v) > 1}
    same_text = [json.loads(next(iter(by_id[i])))["label"] for i in range(0, n, 10)]  # one review, ten offsets
    assert len(set(same_text)) > 1, "every record drew the same answer: the seed does not follow the record"
