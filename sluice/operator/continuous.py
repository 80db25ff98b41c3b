"""The engine thread for continuous engines (the LLM): records join the running batch as soon as there is
room, and each result is produced the moment its request finishes.

The batcher serves as the waiting queue (its time window is ignored: waiting gains nothing when the engine
takes requests one by one). Offsets still commit by watermark, so a result that overtakes an earlier
record never lets that record's offset be committed early. With ``preserve_order`` results are held back
until every earlier record of the same partition has finished, and leave in input order.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from sluice.engines.base import ContinuousEngine
from sluice.operator.bisection import Failed
from sluice.operator.emitter import Emitter
from sluice.operator.observer import Observer
from sluice.operator.record import Pending, TopicPartition
from sluice.operator.state import SharedState
from sluice.operator.worker import EngineThread

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.1  # with nothing queued and nothing running, re-check this often


class ContinuousWorker(EngineThread[list[Pending]]):
    """Owns every call to the continuous engine's ``add`` / ``step`` / ``abort``."""

    def __init__(self, state: SharedState, engine: ContinuousEngine, emitter: Emitter, clock: Callable[[], float],
                 observer: Observer, preserve_order: bool = False) -> None:
        super().__init__(state, emitter, clock, observer)
        self.engine = engine
        self.preserve_order = preserve_order
        self._keys = itertools.count()
        self._running: dict[int, Pending] = {}  # key -> record, for requests added and not finished
        self._order: dict[TopicPartition, deque[int]] = {}  # preserve_order: keys per partition, input order
        self._done: dict[int, tuple[Pending, object]] = {}  # preserve_order: finished, waiting for earlier ones

    def _exit(self) -> None:
        for key in list(self._running):  # stopped with requests unfinished: they stay uncommitted
            self.engine.abort(key)
        self._running.clear()

    def _take(self, now: float) -> list[Pending] | None:
        """Records to add now; an empty list when there is only running work to step; None: nothing to do."""
        s = self.state
        room = self.engine.room()
        new = s.batcher.next_batch(float("inf"), room) if room > 0 and len(s.batcher) else None
        if new:
            s.summary.num_batches += 1
            s.summary.num_batched_records += len(new)
            return new
        return [] if self._running else None

    def _wait_s(self, now: float) -> float | None:
        return _IDLE_WAIT_S

    def _abandon(self, everything: bool, tps: set[TopicPartition]) -> None:
        if everything:
            tps = {p.record.tp for p in self._running.values()} | set(self._order)
        if not tps:
            return
        for key, pending in list(self._running.items()):
            if pending.record.tp in tps:
                self.engine.abort(key)
                del self._running[key]
        for tp in tps:
            for key in self._order.pop(tp, ()):
                self._done.pop(key, None)

    def _process(self, new: list[Pending]) -> None:
        """Records enter the engine here. Per-record containment (containment.py): ``add`` raising, or
        ``step`` returning an exception, fails that record alone; ``step`` itself raising is the engine
        failing, and stops the operator."""
        finished: list[tuple[int, Pending, object]] = []
        started_s = self.clock()
        # One observed "batch" per step: the records admitted now (their queue delay ends here).
        handle = self.observer.batch_started(new, started_s) if new else None
        for pending in new:
            key = next(self._keys)
            if self.preserve_order:
                self._order.setdefault(pending.record.tp, deque()).append(key)
            try:
                self.engine.add(key, pending.item)
                self._running[key] = pending
            except Exception as err:  # this request alone cannot run (too long for the context, say)
                finished.append((key, pending, Failed(err)))
        if self._running:
            for key, result in self.engine.step():
                pending = self._running.pop(key)
                finished.append((key, pending, Failed(result) if isinstance(result, BaseException) else result))
        num_failed = sum(1 for _, _, outcome in finished if isinstance(outcome, Failed))
        self.observer.batch_finished(handle, [p for _, p, _ in finished], self.clock() - started_s, num_failed)
        if finished:
            self._emit(finished)

    def _emit(self, finished: list[tuple[int, Pending, Any]]) -> None:
        if not self.preserve_order:
            self.emitter.settle([p for _, p, _ in finished], [o for _, _, o in finished])
            return
        touched = set()
        for key, pending, outcome in finished:
            self._done[key] = (pending, outcome)
            touched.add(pending.record.tp)
        ready: list[tuple[Pending, object]] = []
        for tp in touched:
            order = self._order.get(tp)
            while order and order[0] in self._done:
                ready.append(self._done.pop(order.popleft()))
        if ready:
            self.emitter.settle([p for p, _ in ready], [o for _, o in ready])
