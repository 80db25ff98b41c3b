"""Adaptive batching to a latency target: the batcher learns the engine and chooses each batch's size.

The user states ``latency_target_ms`` (a record's queue wait + service). The policy keeps two online
estimates -- the engine's service time ``s(b)`` as a function of batch size and padded tokens (least
squares over the latest batches, with a quadratic token term for engines whose cost per token grows with
the batch, like a CPU whose caches a large batch overflows) and the arrival rate -- and makes the classic
choice each time the engine is free: wait for the largest batch that serves more records per second
(``b / s(b)`` at least ``min_gain`` better than going now) and whose oldest record, waiting for the batch
to fill at the current arrival rate and then being served, still finishes within the target:

    age(oldest) + (b - queued) / rate + s(b) <= target * safety

On a GPU (large fixed cost per batch) that means batching up to what the target allows; on a CPU whose
cost is all per record it means not waiting at all.

When no bigger batch fits the target, it dispatches everything queued (up to the maximum) at once: serving
a backlog in small pieces pays the fixed cost again and again. Overload is handled by backpressure;
nothing is dropped.

Pure code: time comes in as arguments; no I/O, no threads.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Decision:
    dispatch_now: bool  # True: take up to ``size`` records now; False: wait until ``wake_at_s``
    size: int  # the batch size chosen
    wake_at_s: float  # when to look again if nothing else happens (a record arrives, say)
    service_s: float  # predicted service time of ``size``
    rate_per_s: float  # arrival-rate estimate used
    max_tokens: int | None = None  # padded tokens the batch may hold (``size`` at the recent mean length)


@dataclass(frozen=True, slots=True)
class ServiceCost:
    """``fixed + per_item * n + per_token * T + per_token2 * T**2`` seconds for ``n`` records padded to
    ``T`` tokens in all. Without token lengths (``T == n``) the token terms carry the per-record cost."""

    fixed_s: float
    per_item_s: float
    per_token_s: float
    per_token2_s: float

    def __call__(self, num_items: float, num_tokens: float) -> float:
        return (self.fixed_s + self.per_item_s * num_items + self.per_token_s * num_tokens
                + self.per_token2_s * num_tokens * num_tokens)


class ServiceModel:
    """Service time as a function of batch size and padded tokens, least squares over the latest batches.

    The fixed term is what batching amortises (kernel launches and weight reads on a GPU); the per-token
    terms are the work itself, the quadratic one for engines whose cost per token grows with the batch (a
    CPU whose caches a large batch overflows, attention over long padded rows). Batch sizes are turned
    into tokens with the recent mean of padded tokens per record.
    """

    def __init__(self, window: int = 128, prior_fixed_s: float = 0.001, prior_per_item_s: float = 0.0001) -> None:
        self._obs: deque[tuple[float, float, float]] = deque(maxlen=window)  # (records, padded tokens, s)
        self._prior = ServiceCost(prior_fixed_s, 0.0, prior_per_item_s, 0.0)
        self._cost: ServiceCost | None = None
        self.tokens_per_item = 1.0  # recent mean padded tokens per record (1 when lengths are not measured)
        self.measures_tokens = False  # some batch reported padded tokens other than its size

    def observe(self, batch_size: int, service_s: float, padded_tokens: int | None = None) -> None:
        tokens = float(padded_tokens if padded_tokens is not None else batch_size)
        self.measures_tokens = self.measures_tokens or tokens != batch_size
        self._obs.append((float(batch_size), tokens, service_s))
        self.tokens_per_item += 0.1 * (tokens / max(1, batch_size) - self.tokens_per_item)
        self._cost = None

    def predict(self, batch_size: int, padded_tokens: float | None = None) -> float:
        """Seconds for ``batch_size`` records (padded to ``padded_tokens``; default: the recent mean)."""
        tokens = padded_tokens if padded_tokens is not None else batch_size * self.tokens_per_item
        return self.cost()(batch_size, tokens)

    def cost(self) -> ServiceCost:
        if self._cost is None:
            self._cost = self._fit()
        return self._cost

    def _fit(self) -> ServiceCost:
        if not self._obs:
            return self._prior
        n = np.array([o[0] for o in self._obs])
        tokens = np.array([o[1] for o in self._obs])
        t = np.array([o[2] for o in self._obs])
        sizes, token_counts = set(n.tolist()), set(tokens.tolist())
        if len(token_counts) == 1:  # one shape seen: cannot split fixed from per-token cost
            return ServiceCost(0.0, 0.0, float(t.mean() / tokens[0]), 0.0)
        with_items = not np.array_equal(n, tokens) and len(sizes) > 1  # lengths measured: n and T differ
        columns = [np.ones_like(n)] + ([n] if with_items else []) + [tokens]
        if len(token_counts) >= 3:
            columns.append(tokens * tokens)
        coef = [float(c) for c in np.linalg.lstsq(np.stack(columns, axis=1), t, rcond=None)[0]]
        fixed = max(0.0, coef.pop(0))
        per_item = max(0.0, coef.pop(0)) if with_items else 0.0
        per_token = max(0.0, coef.pop(0))  # keep the model increasing
        per_token2 = max(0.0, coef.pop(0)) if coef else 0.0
        if fixed == per_item == per_token == per_token2 == 0.0:
            per_token = float((t / tokens).mean())
        return ServiceCost(fixed, per_item, per_token, per_token2)


class ArrivalRate:
    """Records per second, exponentially weighted over ``horizon_s``."""

    def __init__(self, horizon_s: float = 2.0) -> None:
        self.horizon_s = horizon_s
        self._rate = 0.0
        self._last_s: float | None = None
        self._pending = 0  # arrivals at the same instant as the last observation

    def observe(self, count: int, now_s: float) -> None:
        if self._last_s is None:
            self._last_s = now_s
            return
        dt = now_s - self._last_s
        if dt <= 0:
            self._pending += count
            return
        count, self._pending = count + self._pending, 0
        alpha = 1 - math.exp(-dt / self.horizon_s)
        self._rate += alpha * (count / dt - self._rate)
        self._last_s = now_s

    def rate(self, now_s: float) -> float:
        """The estimate, decayed for the time since the last arrival (a stream that stopped is rate 0)."""
        if self._last_s is None:
            return 0.0
        return self._rate * math.exp(-max(0.0, now_s - self._last_s) / self.horizon_s)


class AdaptivePolicy:
    """Chooses batch sizes to meet ``target_s`` while batching as much as the target allows."""

    def __init__(self, target_s: float, max_batch_size: int, safety: float = 0.8, min_gain: float = 1.05) -> None:
        self.target_s = target_s
        self.min_gain = min_gain  # wait for a bigger batch only if it serves at least this much faster
        self.max_batch_size = max_batch_size
        self.budget_s = target_s * safety  # headroom for the estimates' error and the tail
        self.service = ServiceModel()
        self.arrivals = ArrivalRate()

    def decide(self, now_s: float, num_queued: int, oldest_arrival_s: float | None) -> Decision:
        rate = self.arrivals.rate(now_s)
        if num_queued == 0 or oldest_arrival_s is None:
            return Decision(False, 0, math.inf, 0.0, rate)
        age_s = now_s - oldest_arrival_s
        # Throughput per batch size, and the largest batch worth having at all.
        efficiency = [0.0] + [b / max(self.service.predict(b), 1e-9) for b in range(1, self.max_batch_size + 1)]
        best_efficient = max(range(1, self.max_batch_size + 1), key=lambda b: (efficiency[b], -b))
        ready = min(num_queued, self.max_batch_size)
        go_size = max(range(1, ready + 1), key=lambda b: (efficiency[b], b))
        best_size, best_wake = 0, math.inf
        for b in range(ready + 1, best_efficient + 1):
            if efficiency[b] < efficiency[go_size] * self.min_gain:
                continue  # not worth waiting for
            fill_s = (b - num_queued) / rate if rate > 0 else math.inf
            if age_s + fill_s + self.service.predict(b) <= self.budget_s:
                best_size, best_wake = b, now_s + fill_s
        if best_size:  # worth waiting: a bigger batch serves more per second and still meets the target
            return Decision(False, best_size, best_wake, self.service.predict(best_size), rate)
        # Go now, with the most efficient batch the queue allows: serving a backlog in pieces smaller than
        # that pays the fixed cost again for the records behind, and under load loses the race. Its token
        # budget is that size at the recent mean length, so a batch of long records holds fewer of them.
        max_tokens = math.ceil(go_size * self.service.tokens_per_item) if self.service.measures_tokens else None
        return Decision(True, go_size, now_s, self.service.predict(go_size), rate, max_tokens)
