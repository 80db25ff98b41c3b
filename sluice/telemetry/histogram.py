"""Histograms observed a whole batch at a time: one numpy call per batch, never one Python call per value.

Bucket semantics are Prometheus's: bucket ``i`` counts values ``<= bounds[i]`` (cumulative when exported),
and a last ``+Inf`` bucket counts everything. Internally counts are per bucket (not cumulative) so an
observation is one ``searchsorted`` + ``bincount``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Seconds: queue delays, inference times, latencies (100 µs .. 60 s).
SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Records per batch.
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]  # upper bounds, ascending, without +Inf
    counts: np.ndarray  # (len(bounds) + 1,) per-bucket counts (not cumulative); the last is the +Inf bucket
    total: float  # sum of all observed values

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs as Prometheus exposes them, ending with ``+Inf``."""
        running = np.cumsum(self.counts)
        les = [_le(b) for b in self.bounds] + ["+Inf"]
        return list(zip(les, (int(c) for c in running), strict=True))

    def minus(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        """What was observed between ``earlier`` and this snapshot."""
        return HistogramSnapshot(self.bounds, self.counts - earlier.counts, self.total - earlier.total)

    def quantile(self, q: float) -> float:
        """Estimate of quantile ``q`` (0..1) by linear interpolation inside its bucket, like Prometheus's
        ``histogram_quantile``; NaN when empty. A quantile in the +Inf bucket returns the highest bound."""
        n = self.count
        if n == 0:
            return math.nan
        rank = q * n
        running = np.cumsum(self.counts)
        i = int(np.searchsorted(running, rank, side="left"))
        if i >= len(self.bounds):
            return float(self.bounds[-1])
        lower = 0.0 if i == 0 else float(self.bounds[i - 1])
        below = 0 if i == 0 else int(running[i - 1])
        in_bucket = int(self.counts[i])
        return lower + (float(self.bounds[i]) - lower) * ((rank - below) / in_bucket if in_bucket else 1.0)


class BatchHistogram:
    """A thread-safe histogram whose ``observe_many`` takes a whole batch of values."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("histogram bounds must be non-empty, ascending and distinct")
        self.bounds = tuple(float(b) for b in bounds)
        self._edges = np.asarray(self.bounds)
        self._counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self._total = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: np.ndarray) -> None:
        """Count every value of ``values`` (1-D float array)."""
        if values.size == 0:
            return
        # side="left": the first bound >= value, i.e. the bucket whose `le` the value satisfies
        counts = np.bincount(np.searchsorted(self._edges, values, side="left"), minlength=len(self._counts))
        total = float(values.sum())
        with self._lock:
            self._counts += counts
            self._total += total

    def observe(self, value: float) -> None:
        """One value (a per-batch quantity such as the batch size)."""
        i = int(np.searchsorted(self._edges, value, side="left"))
        with self._lock:
            self._counts[i] += 1
            self._total += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(self.bounds, self._counts.copy(), self._total)


def _le(bound: float) -> str:
    """Prometheus's spelling of a bucket bound (as its own client library writes it)."""
    return repr(float(bound))
