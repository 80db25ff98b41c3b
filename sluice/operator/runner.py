"""The runtime: wires source -> intake -> batcher -> engine thread -> emitter -> sink, and runs the poll loop.

Given the outside parts (``build.py``: engine, codec, source, sink) it builds the inner ones and hands each
what it needs. A record's path, hop by hop, one file per hop (docs/architecture.md walks it):

1. ``source.poll`` (sluice/connectors/kafka/kafka_source.py, or files/file_source.py), called by :meth:`Runner.run` below;
2. :class:`~sluice.operator.intake.Intake`: tracked in the ledger, decoded, prepared, queued in the batcher;
3. the engine thread (sluice/operator/worker.py, continuous.py) takes a batch and runs the engine;
4. :class:`~sluice.operator.emitter.Emitter`: each result becomes an output record and is produced;
5. the delivery report acks the record in the ledger (sluice/operator/ledger.py);
6. the delivery strategy (sluice/operator/delivery/) stores or commits the ledger's watermark.

A reload (sluice/operator/reload/) builds a new engine beside the serving one; the loop hands it to the
intake when it is ready, and the engine thread switches to it between two batches.

Threads: the caller's thread is the *intake thread* (the loop below: poll, intake, delivery reports, the
delivery strategy, rebalance callbacks); the engine thread runs beside it. What they share lives in
:class:`~sluice.operator.state.SharedState`; the first reason to stop is its ``stop_reason``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sluice.codecs.record_codec import RecordCodec
from sluice.config import LoadedPipeline
from sluice.engines.engine_contract import BatchEngine, ContinuousEngine
from sluice.engines.identity import ModelIdentity
from sluice.engines.model_source import identify
from sluice.operator.adaptive import AdaptivePolicy
from sluice.operator.backpressure import Backpressure, delivery_brake
from sluice.operator.batcher import Batcher, BatchPolicy
from sluice.operator.continuous import ContinuousWorker
from sluice.operator.delivery import STRATEGIES, Outcome
from sluice.operator.emitter import Emitter
from sluice.operator.gc_tuning import relax_gc, restore_gc
from sluice.operator.intake import Intake
from sluice.operator.ledger import InFlightLedger
from sluice.operator.observer import Observer
from sluice.operator.ports import Sink, Source, SourceFailed
from sluice.operator.progress import LoopProgress, log_changes, run_watchdog
from sluice.operator.record import TopicPartition, names
from sluice.operator.reload.reloader import Reloader
from sluice.operator.serving import Engine, Serving
from sluice.operator.stalls import StallingDecoder, Stalls
from sluice.operator.state import ForcedStop, RunSummary, SharedState
from sluice.operator.worker import EngineThread, EngineWorker

log = logging.getLogger(__name__)

__all__ = ["Runner", "RunSummary"]

_POLL_BATCH = 500  # records taken from the consumer per poll call
_POLL_TIMEOUT_S = 0.05  # how long an idle poll waits; bounds delivery-report and stop latency
_TICK_S = 1.0  # how often the observer gets a tick (status line, gauges)


class Runner:
    """Runs one pipeline until :meth:`stop`, a limit, or a fatal error. Not reusable."""

    def __init__(self, loaded: LoadedPipeline, source: Source, sink: Sink, engine: BatchEngine | ContinuousEngine, *,
                 max_records: int | None = None, idle_exit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None,
                 on_close: Sequence[Callable[[], None]] = (), codec: RecordCodec | None = None,
                 model: ModelIdentity | None = None, warmup_s: float = 0.0, reloader: Reloader | None = None) -> None:
        """``on_close``: called once the run has ended and the source is closed (releases what the builder
        claimed for this run, such as an instance slot). ``codec``: the builder's (with its schema registry
        format); by default one for JSON / raw records. ``model``: the engine's model identity (by default
        hashed here). ``reloader``: builds new versions of the model (without one, a run keeps its engine).

        The caller closes :attr:`engine` after the run, the engine serving at its end: after a reload that
        is not the one given here (which the reloader closed once it was replaced)."""
        p = loaded.pipeline
        self.pipeline, self.source, self.sink = p, source, sink
        self.max_records, self.idle_exit_s, self.clock = max_records, idle_exit_s, clock
        self.observer = observer or Observer()
        codec = codec or RecordCodec(p.codec, p.sink.output)
        b = p.batching
        delivery_type = STRATEGIES[p.delivery]
        adaptive = (AdaptivePolicy(b.latency_target_ms / 1000, b.max_batch_size)
                    if b.latency_target_ms is not None else None)
        self.state = SharedState(Batcher(BatchPolicy.of(b)), InFlightLedger(in_order=delivery_type.in_order),
                                 adaptive)
        self.summary = self.state.summary
        registry = p.codec.schema_registry
        stalls = Stalls(max_stall_s=registry.max_outage_s) if registry is not None else Stalls()
        decoder = StallingDecoder(codec, stalls, source.pause, source.resume, self.observer)
        self.emitter = Emitter(p, sink, codec, self.state, self.observer, clock)
        model = model or identify(engine.model_source(), p.engine.type, p.engine.model_name)
        self.serving = Serving(engine, model, warmup_s)
        self.reloader = reloader
        retire = reloader.retire if reloader is not None else _close
        self.intake = Intake(self.state, decoder, self.serving, self.emitter, self.observer)
        self.worker: EngineThread[Any] = (
            ContinuousWorker(self.state, self.serving, self.emitter, clock, self.observer, retire,
                             preserve_order=p.sink.output.preserve_order)
            if isinstance(engine, ContinuousEngine) else
            EngineWorker(self.state, self.serving, self.emitter, clock, self.observer, retire))
        brake = delivery_brake(p.runtime, delivery_type.in_order, self.emitter, source, clock)
        self.backpressure = Backpressure(p.runtime.max_in_flight, engine.records_per_poll() or _POLL_BATCH,
                                         self.state, source, self.intake.is_stalled, brake)  # small polls: waits on a store
        self.delivery = delivery_type(p, self.state, source, sink, clock)
        self._stop = threading.Event()
        self._loop = LoopProgress()  # the poll loop's progress, for the watchdog
        self.watchdog = run_watchdog(self.state, sink, self._loop, p.runtime.stall_timeout_s, clock)
        self._reload_asked = False
        self._on_close = tuple(on_close)
        # when partitions were last (re)assigned or rewound: records may come again, so idle time starts over
        self._restarted_s = float("-inf")

    # ------------------------------------------------------------------------------------------- public

    def stop(self) -> None:
        """Ask for a graceful stop (safe from signal handlers and other threads)."""
        self._stop.set()

    def force(self) -> None:
        """Stop now, even in the middle of the drain (a second signal; safe from signal handlers): wait for
        no batch and no delivery, commit only what is delivered, abort an open transaction. An engine call
        still running is left to the process's exit (:attr:`abandoned_engine`)."""
        self.state.force()
        self._stop.set()

    @property
    def forced(self) -> bool:
        return self.state.forced

    @property
    def abandoned_engine(self) -> bool:  # after run(): a forced stop left the engine thread in an engine call
        return self.forced and self.worker.is_alive()

    def reload(self) -> None:
        """Ask for a model reload now (safe from signal handlers: a flag the poll loop reads)."""
        self._reload_asked = True

    @property
    def engine(self) -> Engine:
        """The engine serving now (at the end of a run: the one for the caller to close)."""
        return self.worker.serving.engine

    def run(self) -> RunSummary:
        """Consume until stopped, then drain, flush, commit. The engine must already be started."""
        started = self.clock()
        state = self.state
        self.emitter.read_topic_limits()
        gc_thresholds = relax_gc()
        self.observer.model_serving(self.serving.engine, self.serving.identity, self.serving.warmup_s)
        self.worker.start()
        if self.reloader is not None:
            self.reloader.start()
        if self.source.bounded:
            self.observer.bounded()
        self.observer.watching(self.watchdog)
        self.observer.started()
        last_record = last_tick = started
        try:
            self.delivery.start(started)
            if state.stop_reason is None:
                self.source.subscribe(self._on_assign, self._on_revoke, self._on_lost)
            loop = self._loop
            loop.running = True
            while not self._stop.is_set() and state.stop_reason is None:
                loop.turns += 1
                self.backpressure.apply()
                limit = self.backpressure.poll_limit(
                    None if self.max_records is None else self.max_records - self.summary.num_in)
                records = self.source.poll(limit, _POLL_TIMEOUT_S) if limit > 0 else []
                now = self.clock()
                if records:
                    self.intake.take(records, now)
                    last_record = now
                    self.backpressure.apply()  # pause a partition the poll filled before reports free room
                if self.intake.has_stalls:
                    if self.intake.retry_stalled(now):
                        self._restarted_s = now  # their later records come now: idle time starts over
                elif not self.source.assignment:
                    last_record = now  # idle time counts only while partitions are assigned
                self.sink.poll(0)
                if self.reloader is not None:
                    self._reload_pass()
                if self.delivery.tick(now) is Outcome.REWOUND:
                    self._start_over()
                if now - last_tick >= _TICK_S:
                    self.observer.tick(now, state.ledger.num_in_flight, self.source.lag())
                    log_changes(self.watchdog)
                    last_tick = now
                if self._finished(now, last_record):
                    break
        except SourceFailed as err:
            state.stop(str(err))
        except ForcedStop as err:  # a commit or a revoke waited for the engine: it does not happen
            log.debug("%s", err)
        finally:
            self._loop.running = False  # the drain is bounded by its own timeout
            self.observer.stopping()
            try:
                self._shutdown()
            except ForcedStop as err:  # the consumer's close revoked and waited for the engine
                log.debug("%s", err)
            finally:
                for close in self._on_close:
                    close()
            self.observer.stopped()
            restore_gc(gc_thresholds)
        self.summary.elapsed_s = self.clock() - started
        self.summary.error = state.stop_reason
        return self.summary

    # ----------------------------------------------------------------------------------- rebalances

    # The cooperative-sticky protocol calls back at every rebalance of the group, with an empty list when this
    # member gains or loses nothing: that is no event here (no log line, no flush, no rewind).
    def _on_assign(self, tps: list[TopicPartition]) -> None:
        if not tps:
            return
        log.info("assigned %s", names(tps))
        self._restarted_s = self.clock()
        self.observer.assigned(tps)
        self.backpressure.assigned(tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        """Finish what is in flight for the revoked partitions, commit it, forget them. Records still queued
        (or held for the schema registry) are dropped uncommitted: the next owner processes them, once."""
        if not tps:
            return
        log.info("revoking %s", names(tps))
        self.intake.forget(tps)
        self.state.drop_queued(tps)
        if self.delivery.revoke(tps) is Outcome.REWOUND:
            self._start_over()
        self.state.forget(tps)
        self.observer.revoked(tps)

    def _on_lost(self, tps: list[TopicPartition]) -> None:
        if not tps:
            return
        log.warning("lost %s (another member owns them now); nothing of theirs will be committed", names(tps))
        self.intake.forget(tps)
        self.state.drop_queued(tps)
        self.state.forget(tps)
        if self.delivery.lost(tps) is Outcome.REWOUND:
            self._start_over()
        self.observer.revoked(tps)

    def _start_over(self) -> None:
        """The delivery strategy rewound the consumer: whatever was held is read again."""
        self._restarted_s = self.clock()
        self.intake.start_over()

    def _reload_pass(self) -> None:
        assert self.reloader is not None
        if self._reload_asked:
            self._reload_asked = False
            self.reloader.request()
        ready = self.reloader.take_ready()
        if ready is not None:  # the engine thread seals the old engine's records at its next batch...
            self.intake.hand_over(ready)
        self.intake.follow_switch()  # ...and from then on, records are prepared by the new engine

    # --------------------------------------------------------------------------------------- shutdown

    def _finished(self, now: float, last_record: float) -> bool:
        if self.max_records is not None and self.summary.num_in >= self.max_records:
            return True
        if self.source.is_exhausted() and self.state.is_idle():
            return True  # a bounded source is done: every record up to its end has its outputs delivered
        if self.idle_exit_s is None or now - max(last_record, self._restarted_s) < self.idle_exit_s:
            return False
        return self.state.is_idle()

    def _shutdown(self) -> None:
        """Stop taking records, drain in-flight batches within the drain timeout, commit, close. A forced stop
        (:meth:`force`, also in the middle of this) cuts every wait short."""
        deadline = self.clock() + self.pipeline.runtime.drain_timeout_s
        self.state.drain()
        while self.worker.is_alive() and self.clock() < deadline and not self.forced:
            self.sink.poll(0.05)  # serve delivery reports while the engine drains
        self.state.stop_engine()  # the engine thread takes no further batch
        if self.worker.is_alive() and not self.forced:
            # An engine call cannot be interrupted; wait for the current batch rather than tear the engine
            # down under it. Its outputs are produced, just too late to be committed in this run.
            log.warning("drain timeout: waiting for the engine to finish its current batch "
                        "(a second SIGINT / SIGTERM stops without it)")
            while self.worker.is_alive() and not self.forced:
                self.sink.poll(0.05)
        if self.forced:
            log.warning("forced stop: committing only what is delivered%s",
                        "; the engine's current call is abandoned" if self.worker.is_alive() else "")
        if self.reloader is not None:  # closes every engine it built that does not serve at the end
            self.reloader.stop(0 if self.forced else deadline - self.clock())
        self.delivery.shutdown(deadline, forced=self.forced)
        self.source.close()


def _close(engine: Engine) -> None:
    engine.close()
