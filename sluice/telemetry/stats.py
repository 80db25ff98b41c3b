"""The operator's numbers, counted per poll, per batch and per delivery: what metrics and status read.

Pure bookkeeping (no I/O, no Prometheus): the observer feeds it, the Prometheus collector and the status
line read :meth:`OperatorStats.snapshot`. Per-record values (queue delay, latency) arrive as numpy arrays,
one call per batch. Safe to feed from the intake and engine threads at once.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from sluice.operator.record import TopicPartition
from sluice.telemetry.histogram import SECONDS_BUCKETS, SIZE_BUCKETS, BatchHistogram, HistogramSnapshot
from sluice.telemetry.model_stats import ModelsSnapshot, ModelStats
from sluice.telemetry.recent import RecentValues


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent-enough copy of the numbers at one moment (each field is read under its own lock)."""

    num_in: int  # records polled
    num_out: int  # outputs acknowledged by the broker
    num_dead_lettered: dict[str, int]  # by failing stage (decode, prepare, infer, encode...)
    num_batches: int
    batch_size: HistogramSnapshot  # records per batch
    queue_delay_s: HistogramSnapshot  # poll -> batch start, per record
    infer_s: HistogramSnapshot  # engine call per batch (bisection included)
    latency_s: HistogramSnapshot  # poll -> every output acknowledged, per record
    num_in_flight: int  # polled, not yet acknowledged (as of the last tick)
    lag: dict[TopicPartition, int]  # consumer lag per assigned partition (as of the last tick)
    warmup_s: float | None  # engine start (load + warm-up) time
    num_assigned: int  # partitions assigned now
    num_stalled: int = 0  # partitions paused now because their next record waits for the schema registry
    num_stalls: int = 0  # stalls begun since start
    num_stall_retries: int = 0  # retries of stalled partitions' records that failed again
    models: ModelsSnapshot | None = None  # the engine's numbers per model, and the reloads
    first_in_s: float | None = None  # when the first record was polled (the runner's monotonic clock)
    last_out_s: float | None = None  # when the latest delivery (outputs or dead letters) was acknowledged

    @property
    def total_dead_lettered(self) -> int:
        return sum(self.num_dead_lettered.values())


@dataclass
class OperatorStats:
    """Counters, histograms and gauges of one runner. Every ``record_*`` method is O(1) Python calls."""

    batch_size: BatchHistogram = field(default_factory=lambda: BatchHistogram(SIZE_BUCKETS))
    queue_delay_s: BatchHistogram = field(default_factory=lambda: BatchHistogram(SECONDS_BUCKETS))
    infer_s: BatchHistogram = field(default_factory=lambda: BatchHistogram(SECONDS_BUCKETS))
    latency_s: BatchHistogram = field(default_factory=lambda: BatchHistogram(SECONDS_BUCKETS))
    # each record's queue delay since the status line last took them: its percentiles are of real values
    recent_queue_delay_s: RecentValues = field(default_factory=RecentValues)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._num_in = self._num_out = self._num_batches = self._num_in_flight = 0
        self._dead_lettered: Counter[str] = Counter()
        self._lag: dict[TopicPartition, int] = {}
        self._assigned: set[TopicPartition] = set()
        self._stalled: set[TopicPartition] = set()
        self._num_stalls = self._num_stall_retries = 0
        self._first_in_s: float | None = None
        self._last_out_s: float | None = None
        self.warmup_s: float | None = None
        self.models = ModelStats()  # the engine's numbers by model (the metrics' model label), reloads

    def record_polled(self, num_records: int, now_s: float | None = None) -> None:
        """``num_records`` polled at ``now_s`` (the first poll with records starts the run's working time)."""
        with self._lock:
            self._num_in += num_records
            if num_records and now_s is not None and self._first_in_s is None:
                self._first_in_s = now_s

    def record_rejected(self, stages: list[str]) -> None:
        with self._lock:
            self._dead_lettered.update(stages)

    def record_batch(self, queue_delays_s: np.ndarray) -> None:
        """A batch left for the engine; ``queue_delays_s`` (num_records,) is each record's wait."""
        self.batch_size.observe(len(queue_delays_s))
        self.queue_delay_s.observe_many(queue_delays_s)
        self.recent_queue_delay_s.observe_many(queue_delays_s)
        self.models.record_batch(len(queue_delays_s))
        with self._lock:
            self._num_batches += 1

    def record_infer(self, infer_s: float) -> None:
        self.infer_s.observe(infer_s)
        self.models.record_infer(infer_s)

    def record_delivered(self, num_outputs: int, latencies_s: np.ndarray, now_s: float | None = None) -> None:
        """Outputs acknowledged at ``now_s``; ``latencies_s`` (num_records,) is poll-to-ack per input record."""
        self.latency_s.observe_many(latencies_s)
        with self._lock:
            self._num_out += num_outputs
            if now_s is not None:
                self._last_out_s = now_s

    def record_tick(self, num_in_flight: int, lag: dict[TopicPartition, int]) -> None:
        with self._lock:
            self._num_in_flight = num_in_flight
            self._lag = dict(lag)

    def record_assignment(self, added: list[TopicPartition], removed: list[TopicPartition]) -> None:
        with self._lock:
            self._assigned.update(added)
            self._assigned.difference_update(removed)
            for tp in removed:
                self._lag.pop(tp, None)

    def record_stall(self, tp: TopicPartition, first: bool) -> None:
        with self._lock:
            self._stalled.add(tp)
            if first:
                self._num_stalls += 1
            else:
                self._num_stall_retries += 1

    def record_unstall(self, tp: TopicPartition) -> None:
        with self._lock:
            self._stalled.discard(tp)

    @property
    def num_assigned(self) -> int:
        with self._lock:
            return len(self._assigned)

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            scalars = (self._num_in, self._num_out, dict(self._dead_lettered), self._num_batches,
                       self._num_in_flight, dict(self._lag), len(self._assigned))
            stalls = (len(self._stalled), self._num_stalls, self._num_stall_retries)
            working = (self._first_in_s, self._last_out_s)
        num_in, num_out, dead, num_batches, in_flight, lag, num_assigned = scalars
        return StatsSnapshot(num_in=num_in, num_out=num_out, num_dead_lettered=dead, num_batches=num_batches,
                             batch_size=self.batch_size.snapshot(), queue_delay_s=self.queue_delay_s.snapshot(),
                             infer_s=self.infer_s.snapshot(), latency_s=self.latency_s.snapshot(),
                             num_in_flight=in_flight, lag=lag, warmup_s=self.warmup_s, num_assigned=num_assigned,
                             num_stalled=stalls[0], num_stalls=stalls[1], num_stall_retries=stalls[2],
                             models=self.models.snapshot(), first_in_s=working[0], last_out_s=working[1])
