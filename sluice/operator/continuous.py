"""The engine thread for continuous engines (the LLM): records join the running batch as soon as there is
room, and each result is produced the moment its request finishes.

The batcher serves as the waiting queue (its time window is ignored: waiting gains nothing when the engine
takes requests one by one). Offsets still commit by watermark, so a result that overtakes an earlier
record never lets that record's offset be committed early. With ``preserve_order`` results are held back
until every earlier record of the same partition has finished, and leave in input order.

A reload runs both engines until the old one has drained: the records it prepared (sealed in the batcher)
are added to it, its running requests step on to their end beside the new engine's, and then it is
retired. Nothing waits for the old requests to finish, and no request moves between engines (the new model
may tokenise differently); each output names the engine that generated it.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.engines.engine_contract import ContinuousEngine
from sluice.operator.emitter import Emitter
from sluice.operator.failures.bisection import Failed
from sluice.operator.observer import Observer
from sluice.operator.record import Pending, TopicPartition
from sluice.operator.serving import Engine, Serving
from sluice.operator.state import SharedState
from sluice.operator.worker import EngineThread

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.1  # with nothing queued and nothing running, re-check this often

Finished = tuple[int, Pending, object, bytes]  # key, record, result (or Failed), the model's header


@dataclass(eq=False)
class _Lane:
    """One engine and the requests running on it."""

    serving: Serving
    engine: ContinuousEngine
    running: dict[int, Pending] = field(default_factory=dict)  # key -> record, added and not finished


class ContinuousWorker(EngineThread[tuple[_Lane, list[Pending]]]):
    """Owns every call to the continuous engines' ``add`` / ``step`` / ``abort``."""

    def __init__(self, state: SharedState, serving: Serving, emitter: Emitter, clock: Callable[[], float],
                 observer: Observer, retire: Callable[[Engine], None], preserve_order: bool = False) -> None:
        super().__init__(state, serving, emitter, clock, observer, retire)
        self.preserve_order = preserve_order
        self._keys = itertools.count()
        self._lanes = [_Lane(serving, _continuous(serving))]  # the last takes new records; others drain
        self._order: dict[TopicPartition, deque[int]] = {}  # preserve_order: keys per partition, input order
        self._done: dict[int, tuple[Pending, object, bytes]] = {}  # preserve_order: waiting for earlier ones

    def _exit(self) -> None:
        for lane in self._lanes:  # stopped with requests unfinished: they stay uncommitted
            for key in list(lane.running):
                lane.engine.abort(key)
            lane.running.clear()
        for lane in self._lanes[:-1]:
            self.retire(lane.engine)
        del self._lanes[:-1]

    def _take(self, now: float) -> tuple[_Lane, list[Pending]] | None:
        """Records to add now, and the engine they go to; no records when there is only running work to
        step; None: nothing to do."""
        s = self.state
        # a reload: what is queued was prepared by the serving engine (sealed, for it); the new engine steps
        # beside it from the intake's move on
        _, serving = s.model_switch.between_batches(once_sealed_taken=False)
        if serving is not None:
            self._switched(serving)
            self._lanes.append(_Lane(serving, _continuous(serving)))
        # sealed records were prepared by the engine serving before the switch: they go to it
        lane = self._lanes[-2] if s.batcher.num_sealed and len(self._lanes) > 1 else self._lanes[-1]
        self._retire_drained(s.batcher.num_sealed)
        room = lane.engine.room()
        new = s.batcher.next_batch(float("inf"), room) if room > 0 and len(s.batcher) else None
        if new:
            s.summary.num_batches += 1
            s.summary.num_batched_records += len(new)
            return lane, new
        return (lane, []) if any(each.running for each in self._lanes) else None

    def _retire_drained(self, num_sealed: int) -> None:
        """An engine switched away from, with nothing running and nothing sealed for it left, is done."""
        while len(self._lanes) > 1 and not self._lanes[0].running and not num_sealed:
            self.retire(self._lanes.pop(0).engine)

    def _wait_s(self, now: float) -> float | None:
        return _IDLE_WAIT_S

    def _abandon(self, everything: bool, tps: set[TopicPartition]) -> None:
        if everything:
            tps = {p.record.tp for lane in self._lanes for p in lane.running.values()} | set(self._order)
        if not tps:
            return
        for lane in self._lanes:
            for key, pending in list(lane.running.items()):
                if pending.record.tp in tps:
                    lane.engine.abort(key)
                    del lane.running[key]
        for tp in tps:
            for key in self._order.pop(tp, ()):
                self._done.pop(key, None)

    def _process(self, work: tuple[_Lane, list[Pending]]) -> None:
        """Records enter the engine here. Per-record containment (containment.py): ``add`` raising, or
        ``step`` returning an exception, fails that record alone; ``step`` itself raising is the engine
        failing, and stops the operator."""
        lane, new = work
        finished: list[Finished] = []
        started_s = self.clock()
        # One observed "batch" per step: the records admitted now (their queue delay ends here).
        handle = self.observer.batch_started(new, started_s) if new else None
        for pending in new:
            key = next(self._keys)
            if self.preserve_order:
                self._order.setdefault(pending.record.tp, deque()).append(key)
            try:
                lane.engine.add(key, pending.item)
                lane.running[key] = pending
            except Exception as err:  # this request alone cannot run (too long for the context, say)
                finished.append((key, pending, Failed(err), lane.serving.header))
        for each in self._lanes:  # after a reload, the old engine steps on beside the new one until drained
            if each.running:
                for key, result in each.engine.step():
                    outcome = Failed(result) if isinstance(result, BaseException) else result
                    finished.append((key, each.running.pop(key), outcome, each.serving.header))
        num_failed = sum(1 for _, _, outcome, _ in finished if isinstance(outcome, Failed))
        self.observer.batch_finished(handle, [p for _, p, _, _ in finished], self.clock() - started_s, num_failed)
        if finished:
            self._emit(finished)

    def _emit(self, finished: list[Finished]) -> None:
        if not self.preserve_order:
            self.emitter.settle([p for _, p, _, _ in finished], [o for _, _, o, _ in finished],
                                [m for _, _, _, m in finished])
            return
        touched = set()
        for key, pending, outcome, model in finished:
            self._done[key] = (pending, outcome, model)
            touched.add(pending.record.tp)
        ready: list[tuple[Pending, object, bytes]] = []
        for tp in touched:
            order = self._order.get(tp)
            while order and order[0] in self._done:
                ready.append(self._done.pop(order.popleft()))
        if ready:
            self.emitter.settle([p for p, _, _ in ready], [o for _, o, _ in ready], [m for _, _, m in ready])


def _continuous(serving: Serving) -> ContinuousEngine:
    assert isinstance(serving.engine, ContinuousEngine)  # a reload builds the same engine type
    return serving.engine
