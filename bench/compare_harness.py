"""Parent side of ``bench/compare.py``: start a contender process, feed it, watch its output topic.

Two measurements, both read on the output topic:

* :func:`saturation` -- once the contender answers priming records (start-up and group joins do not count),
  a burst of records; records/s from the first send to the last output's produce timestamp, and CPU of the
  contender's process (all threads, from ``/proc``) over the same stretch, per record.
* :func:`latency` -- after a short warm-up, a paced producer offers each load in turn (lowest first) for
  ``duration_s``; each record
  carries its send time (wall clock ms) and end-to-end latency is the output's produce timestamp minus it.
  A load whose outputs do not all arrive within ``drain_s`` is marked overloaded and higher loads are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer

from tests.support.kafka import unique_topic

CHILD = Path(__file__).resolve().parent / "compare_child.py"
NUM_PARTITIONS = 3


@dataclass
class Contender:
    peer: str  # sluice | plain | faust | bytewax
    workload: str  # embed | noop
    batch: int
    delay_ms: int
    threads: int = 2
    batching_options: dict[str, Any] = field(default_factory=dict)  # Sluice only: more batching settings


class Child:
    """A contender process; its stderr goes to a temp file, shown when it fails."""

    def __init__(self, contender: Contender, bootstrap: str, topic_in: str, topic_out: str) -> None:
        self.scratch_dir = tempfile.mkdtemp(prefix=f"compare-{contender.peer}-")
        spec = {"bootstrap": bootstrap, "topic_in": topic_in, "topic_out": topic_out, "group": unique_topic("cmp"),
                "workload": contender.workload, "batch": contender.batch, "delay_ms": contender.delay_ms,
                "threads": contender.threads, "scratch_dir": self.scratch_dir,
                "batching_options": contender.batching_options}
        self.log = tempfile.NamedTemporaryFile(prefix=f"compare-{contender.peer}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, str(CHILD), contender.peer, json.dumps(spec)],
                                     stdout=subprocess.PIPE, stderr=self.log, cwd=CHILD.parents[1])

    def cpu_s(self) -> float:
        """user + system CPU seconds of the process so far, all its threads (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"contender exited with {self.proc.returncode}:\n{self.stderr_tail()}")

    def stderr_tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self) -> dict[str, Any]:
        """SIGTERM, wait (kill after 30 s); the JSON line it printed, if any."""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        os.unlink(self.log.name)
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        return json.loads(lines[-1]) if lines else {}


class OutputReader(threading.Thread):
    """Reads the output topic from the start: (produce timestamp ms, raw value) per record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("cmp-read"),
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe([topic])
        self.rows: list[tuple[int, bytes]] = []
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            for m in self.consumer.consume(5000, 0.05):
                if m.error() is None:
                    self.rows.append((m.timestamp()[1], m.value() or b"{}"))
        self.consumer.close()

    def wait_for(self, count: int, timeout_s: float, child: Child) -> bool:
        """True once ``count`` records are read, False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.rows) >= count:
                return True
            child.check()
            time.sleep(0.02)
        return False


def saturation(bootstrap: str, contender: Contender, topic_in: str, topic_out: str, texts: list[str], n: int,
               start_timeout_s: float = 180, timeout_s: float = 300) -> dict[str, Any]:
    """records/s and CPU µs/record at saturation.

    Once the contender has answered a few priming records (started, joined, warmed up), ``n`` records are
    produced at once; the rate is ``n`` over the time from the first send to the last output's produce
    timestamp (so a contender that emits in bursts, as Bytewax does under a backlog, is not flattered), and
    CPU is the contender's over the same stretch.
    """
    child = Child(contender, bootstrap, topic_in, topic_out)
    reader = OutputReader(bootstrap, topic_out)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    values = [json.dumps({"text": texts[i % len(texts)], "seq": i}).encode() for i in range(n)]
    try:
        _paced(producer, topic_in, texts, phase=-1, rate=100, count=NUM_PARTITIONS * 2)
        if not reader.wait_for(NUM_PARTITIONS * 2, start_timeout_s, child):
            raise RuntimeError(f"{contender.peer}: no output within {start_timeout_s} s of start")
        seen, cpu_start_s, start_ms = len(reader.rows), child.cpu_s(), time.time() * 1000
        for i, value in enumerate(values):
            while True:
                try:
                    producer.produce(topic_in, value, partition=i % NUM_PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(60)
        if not reader.wait_for(seen + n, timeout_s, child):
            raise RuntimeError(f"{contender.peer}: {len(reader.rows) - seen} of {n} outputs in {timeout_s} s")
        cpu_s = child.cpu_s() - cpu_start_s
    except RuntimeError as error:
        raise RuntimeError(f"{error}\n{child.stderr_tail()}") from None
    finally:
        reader.done.set()
        child.stop()
    span_s = max(1e-3, (max(ts for ts, _ in reader.rows[seen: seen + n]) - start_ms) / 1000)
    return {"records_per_s": n / span_s, "num_records": n, "span_s": span_s, "cpu_us_per_record": cpu_s / n * 1e6,
            "cpu_cores": cpu_s / span_s}


def _paced(producer: Producer, topic: str, texts: list[str], phase: int, rate: float, count: int) -> float:
    """Sends ``count`` records at ``rate`` records/s; returns the rate reached (lower when this process cannot
    keep up)."""
    start_s = time.monotonic()
    for i in range(count):
        lag_s = start_s + i / rate - time.monotonic()
        if lag_s > 0:
            time.sleep(lag_s)
        doc = {"text": texts[i % len(texts)], "sent_ms": time.time() * 1000, "phase": phase, "seq": i}
        while True:
            try:
                producer.produce(topic, json.dumps(doc).encode(), key=str(i).encode(), partition=i % NUM_PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    sent_s = time.monotonic() - start_s
    producer.flush(30)
    return count / max(sent_s, 1e-6)


def _percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)),
            "max": float(array.max())}


@dataclass
class LoadResult:
    rate: float
    offered: int
    delivered: int
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max (empty when overloaded)
    overloaded: bool = False
    achieved_rate: float = 0.0  # what the paced producer really sent, records/s


def latency(bootstrap: str, contender: Contender, topic_in: str, topic_out: str, texts: list[str],
            rates: list[float], duration_s: float, drain_s: float = 15,
            warmup_s: float = 2) -> tuple[list[LoadResult], dict[str, Any]]:
    """End-to-end latency at each offered rate (records/s), after ``warmup_s`` at the first rate that is not
    measured; also what the child printed at exit."""
    child = Child(contender, bootstrap, topic_in, topic_out)
    reader = OutputReader(bootstrap, topic_out)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    results: list[LoadResult] = []
    try:
        _paced(producer, topic_in, texts, phase=-1, rate=100, count=NUM_PARTITIONS * 2)  # joins + warm-up
        if not reader.wait_for(NUM_PARTITIONS * 2, 180, child):
            raise RuntimeError(f"{contender.peer}: no output within 180 s of start")
        warmup = max(NUM_PARTITIONS, int(rates[0] * warmup_s))  # new batch shapes, arena growth: not measured
        _paced(producer, topic_in, texts, phase=-1, rate=rates[0], count=warmup)
        if not reader.wait_for(NUM_PARTITIONS * 2 + warmup, drain_s, child):
            raise RuntimeError(f"{contender.peer}: warm-up at {rates[0]:.1f} records/s did not drain in {drain_s} s")
        seen = len(reader.rows)
        for phase, rate in enumerate(rates):
            count = max(20, int(rate * duration_s))
            achieved = _paced(producer, topic_in, texts, phase, rate, count)
            arrived = reader.wait_for(seen + count, drain_s, child)
            docs = [(ts, json.loads(value)) for ts, value in reader.rows[seen:]]
            lat = [ts - doc["sent_ms"] for ts, doc in docs if doc.get("phase") == phase]
            seen = len(reader.rows)
            if not arrived:
                results.append(LoadResult(rate, count, len(lat), overloaded=True, achieved_rate=achieved))
                break
            results.append(LoadResult(rate, count, len(lat), _percentiles(lat), achieved_rate=achieved))
            time.sleep(0.5)
    except RuntimeError as error:
        raise RuntimeError(f"{error}\n{child.stderr_tail()}") from None
    finally:
        reader.done.set()
        extra = child.stop()
    return results, extra
