"""A model swapped mid-stream, under load, on the real broker: ``sluice run`` as a user runs it, with
``engine.reload.watch`` (or ``sluice reload``), checked with plain clients.

The model is a JSON file behind a symlink, loaded by a ``python`` engine factory (tests/integration/funcs.py:
``load_tagger``) that writes its version and the batch it ran in into every output, so the outputs tell
which model made them and which records shared a batch."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from sluice.engines.identity import MODEL_HEADER, parse_label
from tests.integration.pipelines import ROOT
from tests.support.kafka import ConsumedRecord, consume_all, create_topic, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

NUM_PARTITIONS = 3


class Versions:
    """Model versions as files, and ``current``, the symlink the pipeline names, swapped atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current = root / "current"
        self.digests: dict[str, str] = {}  # tag -> the first 12 hex digits of its file's SHA-256

    def deploy(self, name: str, spec: dict[str, Any]) -> None:
        data = json.dumps(spec).encode()
        (self.root / f"{name}.json").write_bytes(data)
        self.digests[str(spec.get("tag", name))] = hashlib.sha256(data).hexdigest()[:12]
        link = self.root / "current.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(f"{name}.json")
        os.replace(link, self.current)  # `ln -sfn v2.json current.tmp && mv -T current.tmp current`


class Tail:
    """Reads a topic from the start on a thread of its own, as a downstream consumer would."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        self.records: list[Any] = []
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("tail"),
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   "isolation.level": isolation})
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                self.records.append(msg)
        self._consumer.close()

    def tags(self) -> list[str]:
        return [json.loads(m.value())["tagged"]["tag"] for m in list(self.records)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Load:
    """Produces ``{"seq": i, "text": ...}`` at a steady rate until stopped: the pipeline works while it swaps."""

    def __init__(self, bootstrap: str, topic: str, per_s: int = 800) -> None:
        self.num_sent = 0
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic, self._per_s = topic, per_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self._per_s)
            for i in range(self.num_sent, due):
                self._producer.produce(self._topic, json.dumps({"seq": i, "text": f"review {i}"}), key=f"k{i}")
            self.num_sent = max(self.num_sent, due)
            self._producer.poll(0)
            time.sleep(0.01)
        assert self._producer.flush(30) == 0

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.num_sent


def start_sluice(tmp_path: Path, bootstrap: str, topic_in: str, topic_out: str, topic_dlq: str, delivery: str,
                 watch: bool) -> tuple[subprocess.Popen[str], list[str], Path]:
    doc: dict[str, Any] = {
        "name": "reload-it",
        "source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [topic_in], "group_id": unique_topic("g"),
                             "config": {"session.timeout.ms": 10000}}},
        "codec": {"format": "json", "input_field": "text"},
        "batching": {"max_batch_size": 32, "max_queue_delay_ms": 5},
        "engine": {"type": "python", "factory": "tests.integration.funcs:load_tagger", "model": "models/current",
                   "model_name": "tagger", "reload": {"watch": watch, "poll_interval_s": 0.2, "settle_s": 0.2}},
        "sink": {"kafka": {"topic": topic_out}, "output": {"mode": "merge", "field": "tagged"}},
        "dead_letter": {"topic": topic_dlq},
        "delivery": delivery,
        "runtime": {"commit_interval_ms": 200, "drain_timeout_s": 20},
    }
    if delivery == "exactly_once":
        doc["exactly_once"] = {"transaction_interval_ms": 100}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "SLUICE_RUN_DIR": str(tmp_path / "run"), "SLUICE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(path), "--idle-exit", "3"], cwd=ROOT,
                            env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    return proc, lines, path


@dataclass
class Run:
    proc: subprocess.Popen[str]
    lines: list[str]  # its stderr (the log), line by line
    path: Path  # the pipeline file
    tail: Tail
    load: Load
    versions: Versions
    topics: tuple[str, str, str]  # in, out, dead letters


@contextlib.contextmanager
def running(bootstrap: str, tmp_path: Path, delivery: str, watch: bool, first: dict[str, Any],
            per_s: int = 800) -> Iterator[Run]:
    """``sluice run`` on model version ``first``, a steady load into it, a reader of its outputs."""
    topics = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for topic, partitions in zip(topics, (NUM_PARTITIONS, NUM_PARTITIONS, 1), strict=True):
        create_topic(bootstrap, topic, partitions)
    (tmp_path / "models").mkdir()
    versions = Versions(tmp_path / "models")
    versions.deploy("v1", first)
    proc, lines, path = start_sluice(tmp_path, bootstrap, *topics, delivery, watch)
    isolation = "read_committed" if delivery == "exactly_once" else "read_uncommitted"
    run = Run(proc, lines, path, Tail(bootstrap, topics[1], isolation), Load(bootstrap, topics[0], per_s),
              versions, topics)
    try:
        yield run
    finally:
        run.load.stop()
        run.tail.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def wait_for(what: str, done: Callable[[], bool], proc: subprocess.Popen[str], lines: list[str],
             timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, f"sluice stopped while waiting for {what}:\n" + "".join(lines[-30:])
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "".join(lines[-30:])
        time.sleep(0.05)


def check_outputs(outputs: list[ConsumedRecord], versions: Versions, num_sent: int, exactly_once: bool) -> list[str]:
    """Every input has one output (exactly-once) or at least one; each names the model that made it; no batch
    mixes models; per input partition one switch, between two batches. Returns the tags in order."""
    seqs = [json.loads(r.value or b"{}")["seq"] for r in outputs]
    assert set(seqs) == set(range(num_sent))
    if exactly_once:
        assert len(seqs) == num_sent
    by_batch: dict[str, set[str]] = defaultdict(set)
    by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for r in outputs:
        headers = {k: (v or b"").decode() for k, v in r.headers}
        name, digest, engine = parse_label(headers[MODEL_HEADER])
        tagged = json.loads(r.value or b"{}")["tagged"]
        assert (name, engine) == ("tagger", "python")
        assert digest == versions.digests[tagged["tag"]], "the header names another model than the one that ran"
        by_batch[tagged["batch"]].add(headers[MODEL_HEADER])
        by_partition[int(headers["sluice.source.partition"])].append((int(headers["sluice.source.offset"]),
                                                                      tagged["tag"]))
    assert all(len(models) == 1 for models in by_batch.values())  # a batch ran on one model
    tags: list[str] = []
    for pairs in by_partition.values():
        in_order = [tag for _, tag in sorted(set(pairs))]
        switches = sum(1 for a, b in zip(in_order, in_order[1:], strict=False) if a != b)
        assert switches <= 1, f"a partition went back and forth between models: {switches} switches"
        tags += in_order
    return tags


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_model_swapped_mid_stream_under_load_names_every_output_and_a_broken_one_changes_nothing(
        kafka_bootstrap: str, tmp_path: Path, delivery: str) -> None:
    exactly_once = delivery == "exactly_once"
    with running(kafka_bootstrap, tmp_path, delivery, True, {"tag": "v1", "pause_s": 0.005}) as r:
        wait_for("v1 outputs", lambda: len(r.tail.records) >= 600, r.proc, r.lines)
        r.versions.deploy("v2", {"tag": "v2", "pause_s": 0.005})
        wait_for("the switch to v2", lambda: "v2" in r.tail.tags(), r.proc, r.lines)
        num_before_broken = len(r.tail.records)
        r.versions.deploy("broken", {"pause_s": 0})  # no tag: the factory refuses it
        wait_for("the broken model's refusal", lambda: any("model reload failed (start)" in x for x in r.lines),
                 r.proc, r.lines)
        wait_for("more v2 outputs", lambda: len(r.tail.records) >= num_before_broken + 600, r.proc, r.lines)
        num_sent = r.load.stop()
        assert r.proc.wait(120) == 0, "".join(r.lines[-30:])
    log, versions = "".join(r.lines), r.versions
    assert "Traceback" not in log
    outputs = consume_all(kafka_bootstrap, r.topics[1], expected_count=num_sent,
                          isolation="read_committed" if exactly_once else "read_uncommitted")
    tags = check_outputs(outputs, versions, num_sent, exactly_once)
    assert tags.count("v1") >= 600 and tags.count("v2") >= 600  # mid-stream: both served a good share
    assert f"still serving tagger@sha256:{versions.digests['v2']} (python)" in log  # the broken one left v2 on
    assert "could not load" in log and "holds no tag" in log  # and why
    assert consume_all(kafka_bootstrap, r.topics[2]) == []


def test_sluice_reload_swaps_the_model_of_the_running_pipeline(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {**os.environ, "SLUICE_RUN_DIR": str(tmp_path / "run")}
    with running(kafka_bootstrap, tmp_path, "at_least_once", False, {"tag": "v1"}, per_s=400) as r:
        wait_for("v1 outputs", lambda: len(r.tail.records) >= 300, r.proc, r.lines)
        r.versions.deploy("v2", {"tag": "v2"})
        time.sleep(1.0)
        assert "v2" not in r.tail.tags()  # not watched: nothing happens on its own
        asked = subprocess.run([sys.executable, "-m", "sluice.cli", "reload", str(r.path)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        assert f"asked process {r.proc.pid}" in asked.stdout
        wait_for("the switch to v2", lambda: "v2" in r.tail.tags(), r.proc, r.lines)
        wait_for("more v2 outputs", lambda: r.tail.tags().count("v2") >= 300, r.proc, r.lines)
        num_sent = r.load.stop()
        assert r.proc.wait(120) == 0, "".join(r.lines[-30:])
    outputs = consume_all(kafka_bootstrap, r.topics[1], expected_count=num_sent)
    check_outputs(outputs, r.versions, num_sent, exactly_once=False)
    assert not list((tmp_path / "run").glob("*.pid"))  # withdrawn at the end
