"""Adaptive batching to a latency target: the batcher learns the engine and chooses each batch's size.

The user states ``latency_target_ms`` (a record's queue wait + service). The policy keeps two online
estimates -- the engine's service time as a function of batch size, ``s(b) = fixed + per_item * b``
(exponentially weighted least squares over the batches it has seen), and the arrival rate -- and makes
the classic choice each time the engine is free: the largest batch whose oldest record, waiting for the
batch to fill at the current arrival rate and then being served, still finishes within the target:

    age(oldest) + max(0, (b - queued) / rate) + s(b) <= target * safety

When no bigger batch fits the target, it dispatches everything queued (up to the maximum) at once: serving
a backlog in small pieces pays the fixed cost again and again. Overload is handled by backpressure;
nothing is dropped.

Pure code: time comes in as arguments; no I/O, no threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decision:
    dispatch_now: bool  # True: take up to ``size`` records now; False: wait until ``wake_at_s``
    size: int  # the batch size chosen
    wake_at_s: float  # when to look again if nothing else happens (a record arrives, say)
    service_s: float  # predicted service time of ``size``
    rate_per_s: float  # arrival-rate estimate used


class ServiceModel:
    """Service time ``fixed_s + per_item_s * b``, fitted by exponentially weighted least squares."""

    def __init__(self, decay: float = 0.97, prior_fixed_s: float = 0.001, prior_per_item_s: float = 0.0001) -> None:
        self.decay = decay
        # weighted sums for the normal equations of t = a + c*b (seeded by a weak prior at b = 1 and 8)
        self._n = self._sb = self._sbb = self._st = self._sbt = 0.0
        for b in (1.0, 8.0):
            self._add(b, prior_fixed_s + prior_per_item_s * b, weight=0.05)

    def observe(self, batch_size: int, service_s: float) -> None:
        for name in ("_n", "_sb", "_sbb", "_st", "_sbt"):
            setattr(self, name, getattr(self, name) * self.decay)
        self._add(float(batch_size), service_s, weight=1.0)

    def predict(self, batch_size: int) -> float:
        fixed, per_item = self.coefficients()
        return fixed + per_item * batch_size

    def coefficients(self) -> tuple[float, float]:
        det = self._n * self._sbb - self._sb * self._sb
        if det <= 1e-12:  # one batch size seen so far: all of it is per-item cost
            return 0.0, self._st / max(self._sb, 1e-9)
        per_item = (self._n * self._sbt - self._sb * self._st) / det
        fixed = (self._st - per_item * self._sb) / self._n
        return max(0.0, fixed), max(0.0, per_item)

    def _add(self, b: float, t: float, weight: float) -> None:
        self._n += weight
        self._sb += weight * b
        self._sbb += weight * b * b
        self._st += weight * t
        self._sbt += weight * b * t


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

    def __init__(self, target_s: float, max_batch_size: int, safety: float = 0.8) -> None:
        self.target_s = target_s
        self.max_batch_size = max_batch_size
        self.budget_s = target_s * safety  # headroom for the estimates' error and the tail
        self.service = ServiceModel()
        self.arrivals = ArrivalRate()

    def decide(self, now_s: float, num_queued: int, oldest_arrival_s: float | None) -> Decision:
        rate = self.arrivals.rate(now_s)
        if num_queued == 0 or oldest_arrival_s is None:
            return Decision(False, 0, math.inf, 0.0, rate)
        age_s = now_s - oldest_arrival_s
        best_size, best_wake = 0, math.inf
        for b in range(1, self.max_batch_size + 1):
            fill_s = 0.0 if b <= num_queued else ((b - num_queued) / rate if rate > 0 else math.inf)
            if age_s + fill_s + self.service.predict(b) <= self.budget_s:
                best_size, best_wake = b, now_s + fill_s
        if best_size > num_queued:  # worth waiting: a bigger batch still meets the target
            return Decision(False, best_size, best_wake, self.service.predict(best_size), rate)
        # Go now, with everything queued (up to the maximum): serving the backlog in smaller pieces would
        # pay the engine's fixed cost again for the records behind, and under load lose the race.
        size = max(1, min(num_queued, self.max_batch_size))
        return Decision(True, size, now_s, self.service.predict(size), rate)
