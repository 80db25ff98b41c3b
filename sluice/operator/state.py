"""What the operator's threads share, owned here and changed only through the named transitions below.

Two threads work on one run: the *intake thread* (the caller's: polls, decodes, serves delivery reports,
runs the delivery strategy and the rebalance callbacks) and the *engine thread* (runs the engine, produces
the results). They share one :class:`SharedState`; every field is guarded by its ``cond`` (a condition on
a re-entrant lock), and each thread receives the state rather than reaching into another part's fields.

Who changes what:

===================  ===================================================================================
field                written by
===================  ===================================================================================
``batcher``          intake (``add_many``; ``remove`` on revoke); engine thread (``next_batch``)
``ledger``           intake (``track_many`` when polled, ``ack_many`` from delivery reports, ``forget``);
                     engine thread (``release`` as outputs are produced)
``summary``          intake (records in, out, dead-lettered); engine thread (batches)
``busy``             engine thread: it holds a batch (or a step) it has not finished producing
``num_steps``        engine thread: batches (steps) finished; read without the lock by the watchdog
``hold``             the delivery strategy (intake): the engine thread must not take new work
``braked``           backpressure's delivery brake (intake): no new work either, until deliveries and commits move
``draining``         shutdown: take every queued record, due or not, then exit
``stopped``          shutdown, or :meth:`stop` on a fatal error: the engine thread exits now
``forced``           :meth:`force` (a second signal; written without the lock, from a signal handler)
``abandoned``        rebalances and rewinds: running requests of these partitions are to be aborted
``model_switch``     a reload's switch (``sluice/operator/reload/switch.py``): the intake offers the new model
                     and follows through its hook (``at_intake``, also in :meth:`queue`); the engine thread
                     seals the batcher and switches through the other (``between_batches``)
``stop_reason``      :meth:`stop` only: the first reason the operator must stop; later ones are logged
===================  ===================================================================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sluice.operator.adaptive import AdaptivePolicy
from sluice.operator.batcher import Batcher
from sluice.operator.ledger import InFlightLedger
from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.operator.reload.switch import ModelSwitch
from sluice.operator.serving import Serving

log = logging.getLogger(__name__)


class ForcedStop(Exception):
    """A forced stop (a second signal) cut a wait for the engine short: what waited -- a commit, a revoke's
    flush -- does not happen; the runner aborts what is open and commits only what is delivered."""


@dataclass
class RunSummary:
    """What a run did, returned by :meth:`Runner.run <sluice.operator.runner.Runner.run>`."""

    num_in: int = 0
    num_out: int = 0
    num_dead_lettered: int = 0
    num_batches: int = 0
    num_batched_records: int = 0
    elapsed_s: float = 0.0
    error: str | None = None  # why the operator stopped on its own, if it did
    first_in_s: float | None = None  # the runner's clock when the first record was polled
    last_out_s: float | None = None  # ... when the latest delivery (outputs or dead letters) was acknowledged

    @property
    def mean_batch_size(self) -> float:
        return self.num_batched_records / self.num_batches if self.num_batches else 0.0

    @property
    def work_s(self) -> float | None:
        """The time spent working: first record polled to last delivery acknowledged (not the wait for the
        first record, nor an ``--idle-exit`` wait after the last); None before a delivery."""
        if self.first_in_s is None or self.last_out_s is None:
            return None
        return self.last_out_s - self.first_in_s


class SharedState:
    """The one owner of what the intake and engine threads share (see the module doc for who writes what)."""

    def __init__(self, batcher: Batcher[Pending], ledger: InFlightLedger[InputRecord, Any],
                 adaptive: AdaptivePolicy | None = None) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.batcher = batcher
        self.ledger = ledger
        self.adaptive = adaptive  # batching to a latency target, when configured
        self.summary = RunSummary()
        self.busy = False
        self.num_steps = 0  # batches (LLM steps) the engine thread finished: its progress, for the watchdog
        self.hold = False
        self.braked = False
        self.draining = False
        self.stopped = False
        self.forced = False
        self.abandoned: set[TopicPartition] = set()
        self.abandon_all = False
        self.model_switch = ModelSwitch(self.cond, batcher)
        self._stop_reason: str | None = None

    # ------------------------------------------------------------------------------------- stopping

    @property
    def stop_reason(self) -> str | None:
        """Why the operator must stop, once something made it (read without the lock: one attribute)."""
        return self._stop_reason

    def stop(self, reason: str) -> None:
        """The operator must stop: commit nothing past what is done, drain, exit non-zero with ``reason``.
        The first reason is kept (it is the cause; what fails after it usually follows from it)."""
        with self.cond:
            if self._stop_reason is None:
                self._stop_reason = reason
                self.cond.notify_all()
            else:
                log.debug("also: %s", reason)

    # ---------------------------------------------------------------------------------- engine thread

    @contextmanager
    def engine_held(self, serve: Callable[[float], Any]) -> Iterator[None]:
        """Within the block the engine thread takes no new batch and has finished its current one. Waiting
        for it, ``serve(0)`` serves delivery reports (the engine thread may be waiting for room to produce).
        Used by the delivery strategy around flushes and commits. Raises :class:`ForcedStop` once the stop
        is forced while it waits: the block does not run."""
        with self.cond:
            self.hold = True
        try:
            while True:
                with self.cond:
                    if not self.busy or self.stopped:
                        break
                    self.cond.wait(0.05)
                if self.forced:
                    raise ForcedStop("forced stop while waiting for the engine's current batch")
                serve(0)
            yield
        finally:
            with self.cond:
                self.hold = False
                self.cond.notify_all()

    def drain(self) -> None:
        """Shutdown begins: the engine thread takes every queued record, due or not, then exits -- at once
        when the operator stops on an error."""
        with self.cond:
            self.draining = True
            self.braked = False  # what is queued is processed within the drain timeout, stalled or not
            if self._stop_reason is not None:
                self.stopped = True
            self.cond.notify_all()

    def force(self) -> None:
        """A forced stop: waits for the engine give up (:meth:`engine_held` raises :class:`ForcedStop`).
        Safe from a signal handler: it sets a flag that the waits read, nothing else."""
        self.forced = True

    def stop_engine(self) -> None:
        """The engine thread takes no further batch and exits."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    # ------------------------------------------------------------------------------------ intake thread

    def queue(self, items: list[tuple[Pending, int]], now: float) -> Serving | None:
        """Intake thread: queue records prepared by the engine it prepares with -- unless the engine thread
        sealed the batcher for a reload meanwhile: then nothing is queued, and the model to prepare them (and
        every later record) with is returned (the switch's intake hook)."""
        with self.cond:
            if (follow := self.model_switch.at_intake()) is not None:
                return follow
            self.batcher.add_many(items, now)
            if self.adaptive is not None:
                self.adaptive.arrivals.observe(len(items), now)
            self.cond.notify_all()
            return None

    def take_abandoned(self) -> tuple[bool, set[TopicPartition]]:
        """Engine thread, before its next step: (abort every running request?, partitions whose running
        requests to abort). Clears both. Call it with ``cond`` held."""
        everything, tps = self.abandon_all, self.abandoned
        self.abandon_all, self.abandoned = False, set()
        return everything, tps

    # ---------------------------------------------------------------------------- rebalances, rewinds

    def drop_queued(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions leaving (revoked, lost): their queued records are dropped uncommitted and their running
        requests abandoned -- the next owner processes them. What is in flight stays in the ledger until
        :meth:`forget` (the delivery strategy may still commit it)."""
        gone = set(tps)
        with self.cond:
            self.batcher.remove(lambda p: p.record.tp in gone)
            self.abandoned |= gone

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions gone: nothing of theirs is committed any more; late delivery reports are ignored."""
        with self.cond:
            self.ledger.forget(tps)

    def drop_all(self) -> None:
        """The consumer is about to be rewound to the committed offsets (an aborted transaction): drop every
        queued record, every running request and all bookkeeping. Call it with the engine held."""
        with self.cond:
            self.batcher.remove(lambda p: True)
            self.ledger.forget_all()
            self.abandon_all = True

    def is_idle(self) -> bool:
        """Nothing queued, nothing in the engine, nothing awaiting delivery."""
        with self.cond:
            return len(self.batcher) == 0 and not self.busy and self.ledger.is_idle()
