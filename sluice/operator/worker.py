"""The engine thread: takes work from the batcher, runs the engine, hands the results to the emitter.

Runs beside the intake thread and shares :class:`~sluice.operator.state.SharedState` with it. The batcher
is asked for a batch only when this thread is free, so while the engine works, the next batch keeps growing.
:class:`EngineThread` is what both kinds of engine thread share (the loop, ``busy``, a crash stopping the
operator); :class:`EngineWorker` runs a batch engine, :class:`~sluice.operator.continuous.ContinuousWorker`
a continuous one (the LLM). Results go to :meth:`Emitter.settle <sluice.operator.emitter.Emitter.settle>`.

A reload switches engines here, between two batches (``reload/switch.py``'s hook): offered a new engine, this thread
takes what the old one prepared as its next batch and seals the rest; once every sealed record has run on
the old engine and the intake prepares with the new one, the next batch runs on the new engine, and the
old one goes to ``retire`` (closed off this thread). Each batch's outputs name the engine that ran it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

from sluice.engines.engine_contract import BatchEngine
from sluice.operator.emitter import Emitter
from sluice.operator.failures.bisection import Failed, infer_isolating
from sluice.operator.failures.oom_governor import BatchSizeGovernor
from sluice.operator.observer import Observer
from sluice.operator.record import Pending, TopicPartition
from sluice.operator.serving import Engine, Serving
from sluice.operator.state import SharedState

log = logging.getLogger(__name__)

_SERVICE_SMOOTHING = 0.2  # weight of the newest batch in the engine-time estimate

W = TypeVar("W")  # one unit of work taken under the lock


class EngineThread(threading.Thread, ABC, Generic[W]):
    """The loop both engine threads run: take work under the lock (``busy`` set), do it outside the lock,
    clear ``busy``. Anything escaping the work is a bug, not a bad record: it stops the operator."""

    def __init__(self, state: SharedState, serving: Serving, emitter: Emitter, clock: Callable[[], float],
                 observer: Observer, retire: Callable[[Engine], None]) -> None:
        super().__init__(name="sluice-engine", daemon=True)
        self.state, self.emitter, self.clock, self.observer = state, emitter, clock, observer
        self.serving = serving  # the engine new work goes to (the newest, once switched)
        self.retire = retire  # an engine switched away from and done with: to be closed (not on this thread)

    def _switched(self, serving: Serving) -> None:
        """Under the lock, between two steps: ``serving`` takes new work from now on."""
        log.info("model switch: %s serves from the next batch on (was %s)", serving.identity.label,
                 self.serving.identity.label)
        self.serving = serving
        self.observer.model_serving(serving.engine, serving.identity, serving.warmup_s)

    def run(self) -> None:
        s = self.state
        try:
            while (work := self._next()) is not None:
                try:
                    self._process(work)
                finally:
                    with s.cond:
                        s.busy = False
                        s.num_steps += 1
                        s.cond.notify_all()
        except BaseException as err:
            log.exception("engine thread failed")
            s.stop(repr(err))
            s.stop_engine()
        finally:
            self._exit()
            unused = s.model_switch.take_unused()  # offered and never switched to (stopped first): not needed
            if unused is not None:
                self.retire(unused.engine)

    def _next(self) -> W | None:
        """Wait for work (None: exit), abandoning requests of partitions that left first. Sets ``busy``."""
        s = self.state
        with s.cond:
            while not s.stopped:
                self._abandon(*s.take_abandoned())
                now = self.clock()
                held = s.hold or s.braked
                if not held:
                    work = self._take(now)
                    if work is not None:
                        s.busy = True
                        return work
                    if s.draining:
                        return None
                s.cond.wait(None if held else self._wait_s(now))
            return None

    @abstractmethod
    def _take(self, now: float) -> W | None:
        """Under the lock, not held: the work to do now, or None to wait ``_wait_s``."""

    @abstractmethod
    def _wait_s(self, now: float) -> float | None:
        """How long to wait for more work after ``_take`` found none (None: until woken)."""

    def _abandon(self, everything: bool, tps: set[TopicPartition]) -> None:  # noqa: B027 - optional hook
        """Under the lock: partitions left (or, ``everything``, the consumer was rewound); abort their running
        requests. A batch engine runs nothing between batches (the batch taken last is finished)."""

    @abstractmethod
    def _process(self, work: W) -> None:
        """Outside the lock: do the work and hand its results to the emitter."""

    def _exit(self) -> None:  # noqa: B027 - optional hook
        """The thread ends (unfinished work stays uncommitted)."""


class EngineWorker(EngineThread[list[Pending]]):
    """Owns every call to a batch engine's ``infer``."""

    def __init__(self, state: SharedState, serving: Serving, emitter: Emitter, clock: Callable[[], float],
                 observer: Observer, retire: Callable[[Engine], None]) -> None:
        super().__init__(state, serving, emitter, clock, observer, retire)
        self.engine: BatchEngine = _batch_engine(serving)
        self.governor = BatchSizeGovernor(state.batcher.policy.max_batch_size)
        # Recent batches' engine time, smoothed: records coming due within it join the next batch due by time.
        self.service_estimate_s = 0.0
        self._wake_at: float | None = None  # when the next batch comes due (set by _take)

    def _take(self, now: float) -> list[Pending] | None:
        s = self.state
        # a reload: what the old engine prepared goes now, as its last batch (the rest sealed for it), and
        # once all of it has run, the new engine takes the next batch
        last, serving = s.model_switch.between_batches(
            lambda: s.batcher.next_batch(float("inf"), self.governor.limit) or [])
        if last:
            return self._count(last)
        if serving is not None:
            self._switch(serving)
        self._wake_at = wake_at = s.batcher.next_deadline()
        limit = self.governor.limit
        max_tokens = None
        due_at = float("inf") if s.draining else now
        if s.adaptive is not None and not s.draining and wake_at is not None:
            decision = s.adaptive.decide(now, len(s.batcher), wake_at - s.batcher.policy.max_queue_delay_s)
            log.debug("adaptive batching: %s", decision)
            self.observer.batching_decided(decision)
            if decision.dispatch_now:
                due_at, limit, max_tokens = float("inf"), min(limit, decision.size), decision.max_tokens
            else:
                self._wake_at = min(wake_at, decision.wake_at_s)
        batch = s.batcher.next_batch(due_at, limit, self.service_estimate_s, max_tokens)
        return self._count(batch) if batch else None

    def _count(self, batch: list[Pending]) -> list[Pending]:
        self.state.summary.num_batches += 1
        self.state.summary.num_batched_records += len(batch)
        return batch

    def _wait_s(self, now: float) -> float | None:
        return None if self._wake_at is None else max(0.0, self._wake_at - now)

    def _switch(self, serving: Serving) -> None:
        """Every record the old engine prepared has run on it: the next batch is the new engine's."""
        old = self.engine
        self._switched(serving)
        self.engine = _batch_engine(serving)
        # what the old model taught: its out-of-memory limit is not the new one's
        self.governor = BatchSizeGovernor(self.state.batcher.policy.max_batch_size)
        self.retire(old)

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
        self.emitter.settle(batch, outcomes, self.serving.header)


def _batch_engine(serving: Serving) -> BatchEngine:
    assert isinstance(serving.engine, BatchEngine)  # a reload builds the same engine type
    return serving.engine
