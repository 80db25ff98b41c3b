"""RecentValues: every value of the interval up to its capacity, a uniform sample beyond, a new interval per take."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.telemetry.recent import RecentValues


def test_an_interval_under_capacity_keeps_every_value_and_take_starts_the_next() -> None:
    recent = RecentValues(capacity=10)
    recent.observe_many(np.array([1.0, 2.0, 3.0]))
    recent.observe_many(np.array([]))
    recent.observe_many(np.array([4.0]))
    assert len(recent) == 4
    assert sorted(recent.take()) == [1.0, 2.0, 3.0, 4.0]
    assert recent.take().size == 0  # nothing since
    recent.observe_many(np.array([5.0]))
    assert list(recent.take()) == [5.0]


def test_beyond_capacity_memory_stays_bounded_and_the_sample_is_uniform() -> None:
    recent = RecentValues(capacity=2000, seed=1)
    values = np.arange(100_000, dtype=np.float64)  # in order: a sample biased to the first or the last shows
    for start in range(0, values.size, 512):
        recent.observe_many(values[start:start + 512])
    assert len(recent) == 100_000
    sample = recent.take()
    assert sample.size == 2000 and len(set(sample.tolist())) == 2000
    assert np.quantile(sample, 0.5) == pytest.approx(50_000, rel=0.05)
    assert np.quantile(sample, 0.99) == pytest.approx(99_000, rel=0.01)
    assert sample.min() < 2_000 and sample.max() > 98_000


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentValues(capacity=0)
