"""Backpressure: a producer ten times faster than the engine, for a minute.

The operator must stay in its group the whole time -- it pauses its partitions at ``max_in_flight`` and
keeps polling, so neither the session timeout (6 s here) nor ``max.poll.interval.ms`` (lowered to 10 s
here, so that a minute covers it six times) can evict it -- and its memory must stay bounded by
``max_in_flight``, not grow with the backlog.

Bound asserted: peak RSS (VmHWM) under PEAK_RSS_BOUND_BYTES. What the bound covers: the interpreter with
pydantic/msgspec/confluent-kafka (~60 MB), librdkafka's fetch buffers (up to 64 MB with its default
queued.max.messages.kbytes, though pausing stops fetching), and at most max_in_flight + one poll of
1 KB records in Python (~11 MB of payload, a few times that as objects).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sluice.operator.runner import _POLL_BATCH
from tests.reliability.ledger import Progress, sequenced
from tests.reliability.operators import Operator, wait_until
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import consume_all, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

DURATION_S = float(os.environ.get("RELIABILITY_BACKPRESSURE_S", "60"))
PRODUCE_PER_S = 1000
ENGINE_PER_S = PRODUCE_PER_S / 10  # 10 ms per input
RECORD_BYTES = 1024
MAX_IN_FLIGHT = 10_000  # the default
PEAK_RSS_BOUND_BYTES = 200 * 1024 * 1024  # measured: 87 MB
ENV = {"RELIABILITY_ITEM_MS": str(1000 / ENGINE_PER_S)}


def test_slow_engine_is_never_evicted_and_memory_stays_bounded(kafka_bootstrap: str, tmp_path: Path,
                                                               record_property: pytest.RecordProperty) -> None:
    topics = make_topics(kafka_bootstrap, partitions=3)
    t_in, t_out, t_dlq = topics
    pipeline = write_pipeline(
        tmp_path / "p.yaml", kafka_bootstrap, topics, unique_topic("g"),
        consumer={"max.poll.interval.ms": 10_000},
        batching={"max_batch_size": 50, "max_queue_delay_ms": 5},
        runtime={"max_in_flight": MAX_IN_FLIGHT, "commit_interval_ms": 200, "drain_timeout_s": 3})
    op = Operator(pipeline, tmp_path / "op.log", env=ENV)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    progress = Progress(kafka_bootstrap, t_out, t_dlq)
    padding = "x" * (RECORD_BYTES - 40)
    num_produced = 0
    rss_samples: list[int] = []
    try:
        wait_until(lambda: "runner: assigned in-" in op.log(), 60, "the operator to join", (op,))
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < DURATION_S:
            while num_produced < elapsed * PRODUCE_PER_S:  # paced: catch up to the wall clock
                producer.produce(t_in, f'{{"seq": {num_produced}, "text": "{padding}"}}', key=str(num_produced))
                num_produced += 1
            producer.poll(0)
            if len(rss_samples) < elapsed * 2:
                rss_samples.append(op.rss_bytes())
            assert op.alive(), op.log()[-3000:]
            time.sleep(0.01)
        assert producer.flush(30) == 0
        peak_rss = op.peak_rss_bytes()
        num_done = progress.count()
        assert op.terminate(timeout_s=60) == 0, op.log()[-3000:]
    finally:
        progress.close()
        op.close()

    log = op.log()
    assert "Traceback" not in log
    assert "SIGTERM received" in log
    before_stop = log[: log.index("SIGTERM received")]  # the SIGTERM itself revokes, as it should
    assert not re.search(r"runner: (lost|revoking) ", before_stop), "partitions were taken away mid-run"
    assert "MAXPOLL" not in log and "SESSTMOUT" not in log, "librdkafka reports a missed poll or heartbeat"
    assert log.count("runner: assigned in-") == 1, "the operator was rebalanced while the engine was slow"
    in_flight = [int(n.replace(",", "")) for n in re.findall(r"in flight ([\d,]+)", log)]
    assert in_flight and max(in_flight) <= MAX_IN_FLIGHT + _POLL_BATCH
    assert num_done < num_produced / 5, "the engine was not the bottleneck: nothing was held back"

    record_property("peak_rss_mb", round(peak_rss / 2**20))
    print(f"\nbackpressure {DURATION_S:.0f} s: {num_produced} produced, {num_done} done, in flight max "
          f"{max(in_flight)}, RSS start {rss_samples[0] / 2**20:.0f} MB, end {rss_samples[-1] / 2**20:.0f} MB, "
          f"peak {peak_rss / 2**20:.0f} MB (bound {PEAK_RSS_BOUND_BYTES / 2**20:.0f} MB)")
    assert peak_rss < PEAK_RSS_BOUND_BYTES


def test_backpressure_starves_no_partition(kafka_bootstrap: str, tmp_path: Path,
                                           record_property: pytest.RecordProperty) -> None:
    """With a small in-flight window, every input partition keeps moving: pausing at max_in_flight must not
    hand the whole window to whichever partition the fetcher returns first, time after time."""
    topics = make_topics(kafka_bootstrap, partitions=3)
    t_in, t_out, _ = topics
    produce(kafka_bootstrap, t_in, sequenced(9000))  # about 3,000 per partition
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, unique_topic("g"),
                              batching={"max_batch_size": 50, "max_queue_delay_ms": 5},
                              runtime={"max_in_flight": 500, "commit_interval_ms": 100, "drain_timeout_s": 5})
    op = Operator(pipeline, tmp_path / "fair.log", env={"RELIABILITY_BATCH_MS": "10"})
    progress = Progress(kafka_bootstrap, t_out)
    try:
        wait_until(lambda: progress.count() >= 3000, 120, "a third of the input to come out", (op,))
        assert op.terminate() == 0, op.log()[-3000:]
    finally:
        progress.close()
        op.close()
    per_partition = Counter(int(dict(r.headers)["sluice.source.partition"] or b"-1")
                            for r in consume_all(kafka_bootstrap, t_out))
    record_property("outputs_per_input_partition", dict(per_partition))
    print(f"\nbackpressure fairness: outputs per input partition after a third of the stream: {dict(per_partition)}")
    assert all(per_partition[p] >= 300 for p in range(3)), f"a partition starved: {dict(per_partition)}"
