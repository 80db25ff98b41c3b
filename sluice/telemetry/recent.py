"""The values observed since the last look: what the status line's percentiles describe.

A histogram's buckets serve Prometheus (cumulative, mergeable) but a percentile read from them is only
known to lie within one bucket -- between 10 s and 30 s, say, where interpolation may print 29.8 s for
delays of 11 s. The status line instead keeps the values themselves, interval by interval.

Guarantees: :meth:`RecentValues.take` returns the values observed since the previous ``take`` (or since
creation) and starts a new interval; up to ``capacity`` values of an interval it returns all of them, beyond
that a uniform random sample of ``capacity`` of them (reservoir sampling), so memory stays bounded however
long nobody looks. One numpy call per batch; thread-safe.
"""

from __future__ import annotations

import threading

import numpy as np

DEFAULT_CAPACITY = 8192  # a p99 from 8,192 values of one interval is within a fraction of a percent of rank


class RecentValues:
    """The values of the current interval (all of them, or a uniform sample of ``capacity``)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._values = np.empty(capacity, dtype=np.float64)
        self._seen = 0  # values observed in this interval (kept or not)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def observe_many(self, values: np.ndarray) -> None:
        """Add a batch of values (1-D)."""
        values = np.asarray(values, dtype=np.float64).ravel()
        if values.size == 0:
            return
        with self._lock:
            kept = min(self._seen, self.capacity)
            room = self.capacity - kept
            if room:  # the interval's first ``capacity`` values are all kept
                head = values[:room]
                self._values[kept:kept + head.size] = head
                self._seen += head.size
                values = values[room:]
            if values.size:  # Algorithm R, a batch at a time: value number i replaces a slot with p = cap / i
                numbers = self._seen + 1 + np.arange(values.size)
                slots = (self._rng.random(values.size) * numbers).astype(np.int64)
                keep = slots < self.capacity
                self._values[slots[keep]] = values[keep]  # a slot drawn twice in one batch keeps one of them
                self._seen += values.size

    def take(self) -> np.ndarray:
        """The interval's values (a copy, in no particular order once sampled); the next interval begins."""
        with self._lock:
            values = self._values[:min(self._seen, self.capacity)].copy()
            self._seen = 0
            return values

    def __len__(self) -> int:
        """How many values this interval has seen so far."""
        with self._lock:
            return self._seen
