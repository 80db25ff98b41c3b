"""The runtime: wires source -> decode/prepare -> batcher -> engine -> encode -> sink, and commits offsets.

Threads: the caller's thread runs the intake loop (poll, decode, prepare, delivery reports, offset
storing, rebalances); an :class:`EngineWorker` thread runs the engine. They share one lock-guarded state.

At-least-once, step by step, for every input record:

1. ``tracker.track`` as soon as it is polled -- before anything can be produced for it;
2. its output (or dead-letter record) is produced together with the rest of its batch, under one
   delivery callback whose count of outstanding reports is set before the first produce (``emitter.py``);
3. ``tracker.ack`` once every record of that batch has a successful delivery report;
4. only the tracker's watermark is stored, and librdkafka commits what was stored.

Per-record containment (sluice/operator/containment.py): any exception raised by the work done for one
record sends that record to the dead-letter topic and the operator goes on; only failures that are not
about one record stop it. Records enter at ``_intake`` (headers, decode, prepare), the engine workers
(infer) and ``Emitter.settle`` (encode, output key and headers).

A record rejected with no dead-letter topic configured is never acked: the watermark stops before it and
the operator stops. A delivery failure also stops the operator without committing past that record.
"""

from __future__ import annotations

import gc
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sluice.config import LoadedPipeline
from sluice.engines.base import BatchEngine, ContinuousEngine, EngineError
from sluice.operator.adaptive import AdaptivePolicy
from sluice.operator.batcher import Batcher, BatchPolicy
from sluice.operator.continuous import ContinuousWorker
from sluice.operator.emitter import Emitter, Sink
from sluice.operator.io_errors import SourceFailed
from sluice.operator.ledger import InFlightLedger
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.operator.stalls import StallingDecoder, Stalls
from sluice.operator.transactions import TransactionFailed, Transactions
from sluice.operator.worker import EngineWorker, SharedState
from sluice.schemas.codec import RecordCodec

log = logging.getLogger(__name__)

_POLL_BATCH = 500  # records taken from the consumer per poll call
_POLL_TIMEOUT_S = 0.05  # how long an idle poll waits; bounds delivery-report and stop latency
_TICK_S = 1.0  # how often the observer gets a tick (status line, gauges)


class Source(Protocol):
    assignment: set[TopicPartition]

    def subscribe(self, on_assign: Any, on_revoke: Any, on_lost: Any) -> None: ...
    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]: ...
    def store(self, watermarks: dict[TopicPartition, int]) -> None: ...
    def commit(self, watermarks: dict[TopicPartition, int]) -> None: ...
    def pause(self, tps: Any) -> None: ...
    def resume(self, tps: Any) -> None: ...
    def lag(self) -> dict[TopicPartition, int]: ...
    @property
    def paused_partitions(self) -> set[TopicPartition]: ...
    def close(self) -> None: ...


@dataclass
class RunSummary:
    num_in: int = 0
    num_out: int = 0
    num_dead_lettered: int = 0
    num_batches: int = 0
    num_batched_records: int = 0
    elapsed_s: float = 0.0
    error: str | None = None  # why the operator stopped on its own, if it did

    @property
    def mean_batch_size(self) -> float:
        return self.num_batched_records / self.num_batches if self.num_batches else 0.0


class Runner:
    """Runs one pipeline until :meth:`stop`, a limit, or a fatal error. Not reusable."""

    def __init__(self, loaded: LoadedPipeline, source: Source, sink: Sink, engine: BatchEngine | ContinuousEngine, *,
                 max_records: int | None = None, idle_exit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None,
                 on_close: Sequence[Callable[[], None]] = (), codec: RecordCodec | None = None) -> None:
        """``on_close``: called once the run has ended and the source is closed (releases what the builder
        claimed for this run, such as an instance slot). ``codec``: the builder's (with its schema registry
        format); by default one for JSON / raw records."""
        p = loaded.pipeline
        self.pipeline = p
        self.source, self.sink, self.engine = source, sink, engine
        self.codec = codec or RecordCodec(p.codec, p.sink.output)
        self.max_records, self.idle_exit_s, self.clock = max_records, idle_exit_s, clock
        b = p.batching
        policy = BatchPolicy.of(b)
        self.state = SharedState(batcher=Batcher(policy), ledger=InFlightLedger(in_order=p.delivery == "exactly_once"))
        if b.latency_target_ms is not None:
            self.state.adaptive = AdaptivePolicy(b.latency_target_ms / 1000, b.max_batch_size)
        self._measure = policy.bucket_by_length or policy.max_batch_tokens is not None  # need item lengths?
        self.observer = observer or Observer()
        self.summary = RunSummary()
        registry = p.codec.schema_registry
        stalls = Stalls(max_stall_s=registry.max_outage_s) if registry is not None else Stalls()
        self.decoder = StallingDecoder(self.codec, stalls, source.pause, source.resume, self.observer)
        self.emitter = Emitter(p, sink, self.codec, self.state, self.observer, self.summary, clock)
        self.worker: EngineWorker | ContinuousWorker
        if isinstance(engine, ContinuousEngine):
            self.worker = ContinuousWorker(self.state, engine, self.emitter.settle, clock, self.observer,
                                           preserve_order=p.sink.output.preserve_order)
        else:
            self.worker = EngineWorker(self.state, engine, self.emitter.settle, clock, self.observer)
        self._stop = threading.Event()
        self._on_close = tuple(on_close)
        # when partitions were last (re)assigned or rewound: records may come again, so idle time starts over
        self._restarted_s = float("-inf")
        self._max_in_flight = p.runtime.max_in_flight
        self._resume_below = max(1, self._max_in_flight // 2)
        self.transactions: Transactions | None = None
        if p.delivery == "exactly_once":
            self.transactions = Transactions(p.exactly_once, cast(Any, sink), cast(Any, source),
                                             hold=self._hold_engine, release=self._release_engine,
                                             watermarks=self._watermarks, forget_all=self._forget_all)

    # ------------------------------------------------------------------------------------------- public

    def stop(self) -> None:
        """Ask for a graceful stop (safe from signal handlers and other threads)."""
        self._stop.set()

    def run(self) -> RunSummary:
        """Consume until stopped, then drain, flush, commit. The engine must already be started."""
        started = self.clock()
        self.emitter.read_topic_limits()
        gc_thresholds = _relax_gc()
        self.worker.start()
        self.observer.started()
        last_store = last_record = last_tick = started
        try:
            if self.transactions is not None:
                self.transactions.start(started, 0)
            self.source.subscribe(self._on_assign, self._on_revoke, self._on_lost)
            while not self._stop.is_set() and self.emitter.fatal is None and self.worker.error is None:
                self._backpressure()
                limit = _POLL_BATCH if self.max_records is None else min(_POLL_BATCH, self.max_records - self.summary.num_in)
                # never poll past the in-flight bound (a poll of up to _POLL_BATCH would overshoot it)
                limit = min(limit, max(1, self._max_in_flight - self.state.ledger.num_in_flight))
                records = self.source.poll(limit, _POLL_TIMEOUT_S) if limit > 0 else []
                now = self.clock()
                if records:
                    self._intake(records, now)
                    last_record = now
                if self.decoder.stalls:
                    self._retry_stalled(now)
                elif not self.source.assignment:
                    last_record = now  # idle time counts only while partitions are assigned
                self.sink.poll(0)
                if self.transactions is not None:
                    if self.transactions.due(now, self.state.num_batches):
                        self.transactions.commit(now, self.state.num_batches)
                elif now - last_store >= self.pipeline.runtime.commit_interval_ms / 1000:
                    self.source.store(self._watermarks())
                    last_store = now
                if now - last_tick >= _TICK_S:
                    self.observer.tick(now, self.state.ledger.num_in_flight, self.source.lag())
                    last_tick = now
                if self._finished(now, last_record):
                    break
        except (TransactionFailed, SourceFailed) as err:
            self.emitter.fatal = str(err)
        finally:
            try:
                self._shutdown()
            finally:
                for close in self._on_close:
                    close()
            self.observer.stopped()
            gc.set_threshold(*gc_thresholds)
            gc.unfreeze()
        self.summary.elapsed_s = self.clock() - started
        self.summary.num_batches = self.state.num_batches
        self.summary.num_batched_records = self.state.num_batched_records
        self.summary.error = self.emitter.fatal or (repr(self.worker.error) if self.worker.error else None)
        return self.summary

    # ------------------------------------------------------------------------------------------- intake

    def _intake(self, records: list[InputRecord], now: float) -> None:
        """Records enter the operator here. Per-record containment (containment.py): each step below that
        looks at one record's content -- its headers and trace context, decoding, ``prepare`` and its
        length -- either handles the record or sends that record alone to the dead-letter topic."""
        s = self.state
        with s.cond:
            s.ledger.track_many(records)
        self.summary.num_in += len(records)
        rejected: list[tuple[InputRecord, str, BaseException | None]] = []
        records = self._observe_polled(records, now, rejected)
        decoded, decode_rejected = self.decoder.decode(records, now)
        rejected.extend(decode_rejected)
        self._admit(decoded, rejected, now)

    def _retry_stalled(self, now: float) -> None:
        """Partitions waiting for the schema registry: retry those due, stop past the outage limit."""
        decoded, rejected, resumed = self.decoder.retry(now)
        if decoded or rejected:
            self._admit(decoded, rejected, now)
        if resumed:
            self._restarted_s = now  # their later records come now: idle time starts over
        expired = self.decoder.expired(now)
        if expired is not None:
            self.emitter.fatal = expired

    def _admit(self, decoded: list[tuple[InputRecord, Any, Any]],
               rejected: list[tuple[InputRecord, str, BaseException | None]], now: float) -> None:
        """Decoded records to the batcher (after ``prepare``), rejected ones to the dead-letter topic."""
        s = self.state
        accepted = self._prepare(decoded, rejected)
        with s.cond:
            s.batcher.add_many(accepted, now)
            if s.adaptive is not None:
                s.adaptive.arrivals.observe(len(accepted), now)
            s.cond.notify_all()
        self.emitter.emit([], [], rejected)

    def _observe_polled(self, records: list[InputRecord], now: float,
                        rejected: list[tuple[InputRecord, str, BaseException | None]]) -> list[InputRecord]:
        """The observer's ``polled`` (trace context from each record's headers) for the whole poll; record by
        record only when that fails, to find the records it fails on. Returns the records that passed."""
        try:
            self.observer.polled(records, now)
            return records
        except Exception:
            pass
        passed = []
        for r in records:
            try:
                self.observer.polled([r], now)
            except Exception as err:
                rejected.append((r, "headers", err))
            else:
                passed.append(r)
        return passed

    def _prepare(self, decoded: list[tuple[InputRecord, Any, Any]],
                 rejected: list[tuple[InputRecord, str, BaseException | None]]) -> list[tuple[Pending, int]]:
        """Engine ``prepare`` (and ``item_length``) for all records at once; one by one only when that fails,
        so that only the records it fails on alone are dead-lettered, with the engine's own exception."""
        engine = self.engine
        try:
            items = engine.prepare([v for _, _, v in decoded])
            if len(items) != len(decoded):
                raise EngineError(f"prepare returned {len(items)} items for {len(decoded)} values")
            if self._measure:
                return [(Pending(r, d, it), _length(engine, it)) for (r, d, _), it in zip(decoded, items, strict=True)]
            return [(Pending(r, d, it), 1) for (r, d, _), it in zip(decoded, items, strict=True)]
        except Exception:
            pass
        accepted = []
        for r, d, v in decoded:
            try:
                items = engine.prepare([v])
                if len(items) != 1:
                    raise EngineError(f"prepare returned {len(items)} items for one value")
                accepted.append((Pending(r, d, items[0]), _length(engine, items[0]) if self._measure else 1))
            except Exception as err:  # RecordError, or anything else the engine raises on this one input
                rejected.append((r, "prepare", err))
        return accepted

    # ----------------------------------------------------------------------------- flow and rebalances

    def _backpressure(self) -> None:
        """Pause the partitions over their share of ``max_in_flight``; resume those with room again.

        Each assigned partition may hold up to its share (``max_in_flight`` / partitions) of records in flight,
        and all of them together ``max_in_flight``. Pausing only the partitions over their share matters:
        librdkafka hands out each fetch partition by partition, so with all partitions paused and resumed
        together the one served first in every fetch crowds the others out (seen: a partition that got no
        record at all). A paused partition keeps being polled for (so the group never evicts it) and resumes
        below half its share, once the total is below the low mark.
        """
        tracker, source = self.state.ledger, self.source
        total, paused = tracker.num_in_flight, source.paused_partitions
        if not source.assignment or (not paused and total < self._max_in_flight // len(source.assignment)):
            return  # nothing can be over its share: the common case costs two lookups
        share = max(1, self._max_in_flight // len(source.assignment))
        over_total = total >= self._max_in_flight
        to_pause, to_resume = [], []
        for tp in source.assignment:
            num = tracker.num_in_flight_of(tp)
            if tp in paused:
                if tp in self.decoder.stalls:
                    continue  # waits for the schema registry, not for room
                if not over_total and num <= share // 2 and total <= self._resume_below:
                    to_resume.append(tp)
            elif over_total or num >= share:
                to_pause.append(tp)
        if to_pause:
            source.pause(to_pause)
            log.debug("paused %s: %d records in flight", _names(to_pause), total)
        if to_resume:
            source.resume(to_resume)
            log.debug("resumed %s: %d records in flight", _names(to_resume), total)

    def _on_assign(self, tps: list[TopicPartition]) -> None:
        log.info("assigned %s", _names(tps))
        self._restarted_s = self.clock()
        self.observer.assigned(tps)
        if self.state.ledger.num_in_flight >= self._max_in_flight:  # a rebalance must not undo backpressure
            self.source.pause(tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        """Finish what is in flight for the revoked partitions, commit it, forget them.

        Records still queued in the batcher are dropped uncommitted: the next owner processes them, once.
        """
        log.info("revoking %s", _names(tps))
        revoked = set(tps)
        self.decoder.forget(tps)  # held records stay uncommitted: the next owner processes them
        s = self.state
        with s.cond:
            s.batcher.remove(lambda p: p.record.tp in revoked)
        if isinstance(self.worker, ContinuousWorker):
            self.worker.drop(revoked)  # unfinished requests of these partitions: the next owner redoes them
        if self.transactions is not None:
            if self.emitter.fatal is None:
                try:  # commit first: the transaction holds the outputs of these partitions' in-flight records
                    self.transactions.commit(self.clock(), s.num_batches)
                except TransactionFailed as err:
                    self.emitter.fatal = str(err)
            # Offsets are committed inside transactions only. After a fatal error (a fenced producer) the
            # outputs of the acknowledged records belong to an aborted transaction: committing their offsets
            # here would lose them.
            watermarks: dict[TopicPartition, int] = {}
        else:
            self._hold_engine()
            self.sink.flush(self.pipeline.runtime.drain_timeout_s)
            watermarks = {tp: off for tp, off in self._watermarks().items() if tp in revoked}
            self._release_engine()
        with s.cond:
            s.ledger.forget(tps)
        self.source.commit(watermarks)
        self.observer.revoked(tps)

    def _hold_engine(self) -> None:
        """Stop the engine thread from taking batches and wait for its current one (serving delivery
        reports meanwhile, so that it can produce)."""
        s = self.state
        with s.cond:
            s.hold = True
        while True:
            with s.cond:
                if not s.busy or s.stopped:
                    return
                s.cond.wait(0.05)
            self.sink.poll(0)

    def _release_engine(self) -> None:
        with self.state.cond:
            self.state.hold = False
            self.state.cond.notify_all()

    def _watermarks(self) -> dict[TopicPartition, int]:
        with self.state.cond:
            return self.state.ledger.watermarks()

    def _forget_all(self) -> None:
        """Drop every queued record and all offset bookkeeping (before rewinding the consumer)."""
        self._restarted_s = self.clock()
        self.source.resume(self.decoder.forget(self.decoder.stalls.partitions()))  # rewound: read them again
        with self.state.cond:
            self.state.batcher.remove(lambda p: True)
            self.state.ledger.forget_all()
        if isinstance(self.worker, ContinuousWorker):
            self.worker.drop_all()  # requests still generating belong to the aborted transaction's records

    def _on_lost(self, tps: list[TopicPartition]) -> None:
        log.warning("lost %s (another member owns them now); nothing of theirs will be committed", _names(tps))
        lost = set(tps)
        self.decoder.forget(tps)
        with self.state.cond:
            self.state.batcher.remove(lambda p: p.record.tp in lost)
            self.state.ledger.forget(tps)
        if isinstance(self.worker, ContinuousWorker):
            self.worker.drop(lost)
        if self.transactions is not None and self.emitter.fatal is None:
            # The open transaction holds outputs of the lost partitions, which their new owner redoes:
            # abort it, and rewind the partitions still ours (its other outputs go with it).
            try:
                self.transactions.abort(self.clock(), self.state.num_batches, f"lost {_names(tps)}")
            except TransactionFailed as err:
                self.emitter.fatal = str(err)
        self.observer.revoked(tps)

    # --------------------------------------------------------------------------------------- shutdown

    def _finished(self, now: float, last_record: float) -> bool:
        if self.max_records is not None and self.summary.num_in >= self.max_records:
            return True
        if self.idle_exit_s is None or now - max(last_record, self._restarted_s) < self.idle_exit_s:
            return False
        with self.state.cond:
            return len(self.state.batcher) == 0 and not self.state.busy and self.state.ledger.is_idle()

    def _shutdown(self) -> None:
        """Stop taking records, drain in-flight batches within the drain timeout, flush, commit, close."""
        deadline = self.clock() + self.pipeline.runtime.drain_timeout_s
        s = self.state
        with s.cond:
            s.draining = True
            if self.emitter.fatal is not None:
                s.stopped = True
            s.cond.notify_all()
        while self.worker.is_alive() and self.clock() < deadline:
            self.sink.poll(0.05)  # serve delivery reports while the engine drains
        with s.cond:
            s.stopped = True  # the engine thread takes no further batch
            s.cond.notify_all()
        if self.worker.is_alive():
            # An engine call cannot be interrupted; wait for the current batch rather than tear the engine
            # down under it. Its outputs are produced, just too late to be committed in this run.
            log.warning("drain timeout: waiting for the engine to finish its current batch")
            while self.worker.is_alive():
                self.sink.poll(0.05)
        if self.transactions is not None:
            if self.emitter.fatal is None:
                try:
                    self.transactions.commit(self.clock(), s.num_batches, reopen=False)
                except TransactionFailed as err:
                    self.emitter.fatal = str(err)
            else:  # it holds outputs of records whose offsets will not be committed: settle it now
                self.transactions.abort_open()
        else:
            left = self.sink.flush(max(1.0, deadline - self.clock()))
            with s.cond:
                watermarks = s.ledger.watermarks()
                unfinished = s.ledger.num_in_flight
            if left or unfinished:
                log.warning("drain timeout: %d records unfinished, %d deliveries outstanding; "
                            "they stay uncommitted and will be processed again", unfinished, left)
            self.source.commit(watermarks)
        self.source.close()


def _length(engine: BatchEngine | ContinuousEngine, item: Any) -> int:
    """``item_length`` as the batcher needs it: an integer of at least 1."""
    return max(1, operator.index(engine.item_length(item)))


def _relax_gc() -> tuple[int, int, int]:
    """Make the cyclic garbage collector cheap for a stream of short-lived records.

    Every record allocates a few small container objects; with CPython's default thresholds the collector
    runs every 700 allocations and, with thousands of records in flight, its full passes cost about a third
    of the operator's CPU (measured by bench/operator_overhead.py). Records hold no reference cycles, so
    reference counting frees them anyway: collect less often, and freeze what exists at start (modules,
    the model) so that full passes never walk it again. Returns the old thresholds to restore.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return old


def _names(tps: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps, key=lambda t: (t.topic, t.partition)))
