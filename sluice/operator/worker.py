"""The engine thread: takes due batches from the batcher, runs the engine, produces the results.

Runs beside the operator's main (intake) thread and shares :class:`SharedState` with it. The batcher is
asked for a batch only when this thread is free, so while the engine works, the next batch keeps growing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.engines.base import BatchEngine
from sluice.operator.adaptive import AdaptivePolicy
from sluice.operator.batcher import Batcher
from sluice.operator.bisection import Failed, infer_isolating
from sluice.operator.ledger import InFlightLedger
from sluice.operator.observer import Observer
from sluice.operator.oom_governor import BatchSizeGovernor
from sluice.operator.record import InputRecord, Pending

log = logging.getLogger(__name__)

_SERVICE_SMOOTHING = 0.2  # weight of the newest batch in the engine-time estimate


@dataclass
class SharedState:
    """What the intake thread and the engine thread share. Every field is guarded by ``cond``."""

    batcher: Batcher[Pending]
    ledger: InFlightLedger[InputRecord, Any]  # every record between poll and delivery; in order under exactly-once
    cond: threading.Condition = field(default_factory=lambda: threading.Condition(threading.RLock()))
    busy: bool = False  # the engine thread holds a batch it has not finished producing
    hold: bool = False  # the intake thread asked the engine thread not to take new batches (revoke)
    draining: bool = False  # shutdown: take every queued record, due or not, then exit
    stopped: bool = False  # the engine thread must exit now
    num_batches: int = 0
    num_batched_records: int = 0
    adaptive: AdaptivePolicy | None = None  # batching to a latency target, when configured


# (the batch, one engine result or Failed per record) -> produce outputs and settle offsets
Settle = Callable[[list[Pending], list[object]], None]


class EngineWorker(threading.Thread):
    """Owns every call to ``engine.infer``; ``settle`` produces a finished batch's records and settles
    their offsets (see the runner)."""

    def __init__(self, state: SharedState, engine: BatchEngine, settle: Settle,
                 clock: Callable[[], float], observer: Observer) -> None:
        super().__init__(name="sluice-engine", daemon=True)
        self.state = state
        self.engine = engine
        self.settle = settle
        self.clock = clock
        self.observer = observer
        self.governor = BatchSizeGovernor(state.batcher.policy.max_batch_size)
        self.error: BaseException | None = None
        # Recent batches' engine time, smoothed: records coming due within it join the next batch due by time.
        self.service_estimate_s = 0.0

    def run(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                try:
                    self._process(batch)
                finally:
                    with self.state.cond:
                        self.state.busy = False
                        self.state.cond.notify_all()
        except BaseException as err:  # a bug, not a bad record: stop the operator, commit nothing more
            log.exception("engine thread failed")
            self.error = err
            with self.state.cond:
                self.state.stopped = True
                self.state.cond.notify_all()

    def _next_batch(self) -> list[Pending] | None:
        s = self.state
        with s.cond:
            while True:
                if s.stopped:
                    return None
                now = self.clock()
                wake_at = s.batcher.next_deadline()
                if not s.hold:
                    limit = self.governor.limit
                    max_tokens = None
                    due_at = float("inf") if s.draining else now
                    if s.adaptive is not None and not s.draining and wake_at is not None:
                        decision = s.adaptive.decide(now, len(s.batcher),
                                                     wake_at - s.batcher.policy.max_queue_delay_s)
                        log.debug("adaptive batching: %s", decision)
                        self.observer.batching_decided(decision)
                        if decision.dispatch_now:
                            due_at, limit, max_tokens = float("inf"), min(limit, decision.size), decision.max_tokens
                        else:
                            wake_at = min(wake_at, decision.wake_at_s)
                    batch = s.batcher.next_batch(due_at, limit, self.service_estimate_s, max_tokens)
                    if batch:
                        s.busy = True
                        s.num_batches += 1
                        s.num_batched_records += len(batch)
                        return batch
                    if s.draining:
                        return None
                s.cond.wait(None if wake_at is None or s.hold else max(0.0, wake_at - now))

    def _process(self, batch: list[Pending]) -> None:
        """Records enter inference here. Per-record containment (containment.py): a failing batch is
        bisected and only the records that fail alone become :class:`Failed` (dead-lettered by
        ``settle``); ``settle`` contains whatever fails while results become output records."""
        padded_tokens = self.state.batcher.last_padded_tokens  # set when the batch was taken (under the lock)
        started_s = self.clock()
        handle = self.observer.batch_started(batch, started_s)
        outcomes = infer_isolating(self.engine.infer, [p.item for p in batch], self.governor)
        num_failed = sum(1 for o in outcomes if isinstance(o, Failed))
        infer_s = self.clock() - started_s
        self.service_estimate_s += _SERVICE_SMOOTHING * (infer_s - self.service_estimate_s)
        if self.state.adaptive is not None and not num_failed:
            with self.state.cond:
                self.state.adaptive.service.observe(len(batch), infer_s, padded_tokens)
        self.observer.batch_finished(handle, batch, infer_s, num_failed)
        self.settle(batch, outcomes)
