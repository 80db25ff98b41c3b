"""Batch histograms against prometheus_client's own Histogram, fed one value at a time."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from sluice.telemetry.histogram import SECONDS_BUCKETS, BatchHistogram


def _prometheus_buckets(values: np.ndarray, bounds: tuple[float, ...]) -> tuple[list[tuple[str, int]], float]:
    registry = CollectorRegistry()
    reference = Histogram("h", "reference", buckets=bounds, registry=registry)
    for v in values:
        reference.observe(float(v))
    buckets, total = [], math.nan
    for sample in next(iter(registry.collect())).samples:
        if sample.name == "h_bucket":
            buckets.append((sample.labels["le"], int(sample.value)))
        elif sample.name == "h_sum":
            total = sample.value
    return buckets, total


def test_bucket_counts_match_prometheus_client_including_values_on_bounds() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(-5, 2, 3000), np.asarray(SECONDS_BUCKETS), [0.0, 1e6]])
    h = BatchHistogram(SECONDS_BUCKETS)
    for chunk in np.array_split(values, 7):  # several batches accumulate
        h.observe_many(chunk)
    h.observe(0.003)
    values = np.append(values, 0.003)
    expected, total = _prometheus_buckets(values, SECONDS_BUCKETS)
    snap = h.snapshot()
    assert snap.cumulative() == expected
    assert snap.count == len(values)
    assert math.isclose(snap.total, total, rel_tol=1e-9)


def test_quantile_interpolates_inside_the_bucket() -> None:
    h = BatchHistogram((1.0, 2.0, 4.0))
    h.observe_many(np.asarray([0.5] * 50 + [3.0] * 50))
    snap = h.snapshot()
    assert snap.quantile(0.5) == 1.0  # the 50th value closes the first bucket
    assert math.isclose(snap.quantile(0.99), 2.0 + 2.0 * (49 / 50))
    assert math.isnan(BatchHistogram((1.0,)).snapshot().quantile(0.99))


def test_a_window_is_the_difference_of_two_snapshots() -> None:
    h = BatchHistogram((1.0, 2.0))
    h.observe_many(np.asarray([0.5, 0.5]))
    earlier = h.snapshot()
    h.observe_many(np.asarray([1.5, 5.0]))
    window = h.snapshot().minus(earlier)
    assert window.counts.tolist() == [0, 1, 1]
    assert window.total == 6.5
