"""Adaptive batching, simulated: a Poisson stream into an engine whose service time grows with batch size.

Clock injected (simulated seconds); deterministic seeds. The adaptive policy must meet the latency target
at every arrival rate where some static (max_batch_size, max_queue_delay_ms) setting meets it.
"""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from sluice.operator.adaptive import AdaptivePolicy, ArrivalRate, ServiceModel

FIXED_S, PER_ITEM_S = 0.005, 0.0005  # a GPU-like engine: batching amortises a large fixed cost
TARGET_S = 0.050
MAX_BATCH = 64
TOKENS_PER_ITEM = 40  # padded tokens per record in the CPU-like engine


def service_s(b: int) -> float:
    return FIXED_S + PER_ITEM_S * b


def cpu_service_s(b: int) -> float:
    """A CPU embedding engine, as measured for MiniLM: 2.5 ms per call, 90 µs per token, and each token
    dearer once a batch passes 256 tokens and overflows the caches."""
    tokens = b * TOKENS_PER_ITEM
    return 0.0025 + 0.00009 * tokens + 0.00009 * max(0, tokens - 256) ** 2 / 1024


ENGINES = {"gpu": (service_s, None), "cpu": (cpu_service_s, TOKENS_PER_ITEM)}


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            return out
        out.append(t)


def p99(latencies: list[float]) -> float:
    latencies = sorted(latencies)
    return latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]


def simulate_static(times: list[float], size: int, delay_s: float, engine: str = "gpu") -> float:
    """The operator's static batcher: the engine, when free, takes a batch once it is full or its oldest
    record has waited ``delay_s``."""
    queue: deque[float] = deque()
    lat, i, now, free_at = [], 0, 0.0, 0.0
    while i < len(times) or queue:
        if not queue:
            now = max(now, times[i])
        while i < len(times) and times[i] <= now:
            queue.append(times[i])
            i += 1
        due_at = queue[0] + delay_s if len(queue) < size else now
        start = max(now, free_at, due_at)
        if i < len(times) and times[i] < start:  # something arrives first: re-evaluate then
            now = max(now, times[i])
            continue
        now = start
        batch = [queue.popleft() for _ in range(min(size, len(queue)))]
        free_at = now + ENGINES[engine][0](len(batch))
        lat += [free_at - t for t in batch]
        now = free_at
    return p99(lat)


def simulate_adaptive(times: list[float], engine: str = "gpu") -> tuple[float, list[int]]:
    cost, tokens_per_item = ENGINES[engine]
    policy = AdaptivePolicy(TARGET_S, MAX_BATCH)
    queue: deque[float] = deque()
    lat, sizes, i, now = [], [], 0, 0.0
    while i < len(times) or queue:
        if not queue:
            now = max(now, times[i])
        while i < len(times) and times[i] <= now:
            queue.append(times[i])
            policy.arrivals.observe(1, times[i])
            i += 1
        d = policy.decide(now, len(queue), queue[0])
        if not d.dispatch_now:
            nxt = times[i] if i < len(times) else math.inf
            now = min(d.wake_at_s, nxt) if min(d.wake_at_s, nxt) < math.inf else now
            if now == d.wake_at_s and (i >= len(times) or times[i] > now):
                d = policy.decide(now, len(queue), queue[0])
                if not d.dispatch_now:  # the stream stalled: go with what is here
                    d = type(d)(True, min(len(queue), MAX_BATCH), now, d.service_s, d.rate_per_s)
            else:
                continue
        batch = [queue.popleft() for _ in range(min(d.size, len(queue)))]
        took = cost(len(batch))
        policy.service.observe(len(batch), took, None if tokens_per_item is None else len(batch) * tokens_per_item)
        now += took
        lat += [now - t for t in batch]
        sizes.append(len(batch))
    return p99(lat), sizes


STATIC_GRID = [(b, d / 1000) for b in (1, 2, 4, 8, 16, 32, 64) for d in (0, 1, 2, 5, 10, 20, 40)]


@pytest.mark.parametrize("rate", [50, 300, 1000, 1400])
def test_meets_the_target_wherever_a_static_setting_can(rate: float) -> None:
    times = arrivals(rate, duration_s=3.0, seed=rate)
    static = {setting: simulate_static(times, *setting) for setting in STATIC_GRID}
    feasible = {s: v for s, v in static.items() if v <= TARGET_S}
    adaptive_p99, sizes = simulate_adaptive(times)
    if feasible:
        assert adaptive_p99 <= TARGET_S, (f"rate {rate}/s: adaptive p99 {adaptive_p99 * 1000:.1f} ms misses "
                                          f"the target; e.g. static {min(feasible, key=feasible.get)} meets it")
    # it batches as the load requires: bigger batches at higher rates
    mean_size = sum(sizes) / len(sizes)
    assert mean_size >= min(MAX_BATCH, rate * FIXED_S) * 0.5


@pytest.mark.parametrize("rate", [20, 100, 160, 200])
def test_on_a_cpu_engine_it_meets_the_target_and_learns_where_batches_stop_paying(rate: float) -> None:
    times = arrivals(rate, duration_s=6.0, seed=rate)
    static = {setting: simulate_static(times, *setting, engine="cpu") for setting in STATIC_GRID}
    feasible = {s: v for s, v in static.items() if v <= TARGET_S}
    assert feasible or rate >= 200  # (the grid's best sustains about 210/s: 200 leaves it no headroom)
    adaptive_p99, sizes = simulate_adaptive(times, engine="cpu")
    if feasible:
        assert adaptive_p99 <= TARGET_S, (f"rate {rate}/s: adaptive p99 {adaptive_p99 * 1000:.1f} ms misses "
                                          f"the target; e.g. static {min(feasible, key=feasible.get)} meets it")
    # past 256 tokens (6 records of 40) each token costs more: it does not wait for batches beyond that
    assert max(sizes) <= 16


def test_a_static_setting_that_is_right_for_one_rate_is_wrong_for_another() -> None:
    # the reason for the adaptive mode: no single static setting meets the target at every rate
    per_rate = {r: {s for s in STATIC_GRID if simulate_static(arrivals(r, 3.0, r), *s) <= TARGET_S}
                for r in (50, 1400)}
    assert per_rate[50] and per_rate[1400]
    assert (1, 0.0) in per_rate[50] and (1, 0.0) not in per_rate[1400]


def test_service_model_learns_fixed_and_per_item_costs() -> None:
    model = ServiceModel()
    for b in [1, 4, 16, 64, 8, 32] * 20:
        model.observe(b, 0.004 + 0.0003 * b)
    cost = model.cost()
    assert cost.fixed_s == pytest.approx(0.004, rel=0.05) and cost.per_token_s == pytest.approx(0.0003, rel=0.05)
    assert cost.per_token2_s == pytest.approx(0.0, abs=1e-7)
    assert model.predict(10) == pytest.approx(0.007, rel=0.05)


def test_service_model_sees_a_cost_per_record_that_grows_with_the_batch() -> None:
    model = ServiceModel()
    for b in [1, 4, 16, 64, 8, 32] * 20:
        model.observe(b, 0.002 * b + 0.00005 * b * b)  # a CPU padding batches: no fixed cost to amortise
    assert model.predict(64) == pytest.approx(0.002 * 64 + 0.00005 * 64 * 64, rel=0.05)


def test_service_model_separates_per_record_and_per_token_costs() -> None:
    # an embedding engine: a fixed cost per call, a little per record (pooling), the rest per padded token,
    # growing once a batch overflows the cache
    def engine_s(n: int, tokens: int) -> float:
        return 0.0025 + 0.0001 * n + 0.00008 * tokens + 2e-8 * tokens * tokens

    rng = random.Random(3)
    model = ServiceModel()
    for _ in range(128):
        n = rng.randint(1, 32)
        tokens = n * rng.choice([8, 16, 32, 64, 128])
        model.observe(n, engine_s(n, tokens), tokens)
    for n, tokens in [(1, 40), (8, 256), (32, 1024), (4, 512)]:
        assert model.predict(n, tokens) == pytest.approx(engine_s(n, tokens), rel=0.02)
    # without a token count, a batch size is priced at the recent mean padded length per record
    assert 8 < model.tokens_per_item < 128


def test_on_an_engine_with_no_fixed_cost_it_does_not_wait_for_batches() -> None:
    policy = AdaptivePolicy(target_s=0.5, max_batch_size=64)
    for b in [1, 2, 4, 8, 16, 32, 64] * 5:
        policy.service.observe(b, 0.002 * b + 0.00005 * b * b)
    for t in range(100):
        policy.arrivals.observe(1, t * 0.01)  # 100 records/s: waiting for 8 would take 70 ms and fit
    decision = policy.decide(now_s=1.0, num_queued=1, oldest_arrival_s=0.999)
    assert decision.dispatch_now and decision.size == 1


def test_a_backlog_decision_carries_a_token_budget_once_lengths_are_measured() -> None:
    policy = AdaptivePolicy(target_s=0.5, max_batch_size=64)
    for b in [1, 2, 4, 8, 16, 32, 64] * 5:
        policy.service.observe(b, 0.0025 + 0.00009 * 40 * b + 2e-7 * (40 * b) ** 2, 40 * b)
    decision = policy.decide(now_s=1.0, num_queued=500, oldest_arrival_s=0.0)  # a backlog: go now
    assert decision.dispatch_now and decision.max_tokens is not None
    assert decision.max_tokens == pytest.approx(decision.size * policy.service.tokens_per_item, abs=1)
    plain = AdaptivePolicy(target_s=0.5, max_batch_size=64)
    plain.service.observe(8, 0.01)  # no lengths (tokens == records): no token budget
    assert plain.decide(now_s=1.0, num_queued=500, oldest_arrival_s=0.0).max_tokens is None


def test_arrival_rate_tracks_steps_and_decays_when_the_stream_stops() -> None:
    est = ArrivalRate(horizon_s=0.5)
    t = 0.0
    for _ in range(400):
        t += 0.01
        est.observe(1, t)  # 100/s
    assert est.rate(t) == pytest.approx(100, rel=0.1)
    for _ in range(3000):
        t += 0.001
        est.observe(1, t)  # 1000/s
    assert est.rate(t) == pytest.approx(1000, rel=0.1)
    assert est.rate(t + 5.0) < 1.0
