"""The runtime: wires source -> decode/prepare -> batcher -> engine -> encode -> sink, and commits offsets.

Threads: the caller's thread runs the intake loop (poll, decode, prepare, delivery reports, offset
storing, rebalances); an :class:`EngineWorker` thread runs the engine. They share one lock-guarded state.

At-least-once, step by step, for every input record:

1. ``tracker.track`` as soon as it is polled -- before anything can be produced for it;
2. ``tracker.expect`` for each output / dead-letter record *before* producing it, so an early delivery
   report can never complete the record too soon;
3. ``tracker.ack`` from each successful delivery report, and once more when its processing is over;
4. only the tracker's watermark is stored, and librdkafka commits what was stored.

A record rejected with no dead-letter topic configured is never acked: the watermark stops before it and
the operator stops. A delivery failure also stops the operator without committing past that record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from sluice.config import LoadedPipeline
from sluice.engines.base import BatchEngine, RecordError
from sluice.operator.batcher import Batcher, BatchPolicy
from sluice.operator.dead_letter import dead_letter, source_headers
from sluice.operator.errors import Failed
from sluice.operator.offsets import OffsetTracker
from sluice.operator.record import InputRecord, OutputRecord, Pending, TopicPartition
from sluice.operator.worker import EngineWorker, SharedState
from sluice.schemas.codec import CodecError, RecordCodec

log = logging.getLogger(__name__)

_POLL_BATCH = 500  # records taken from the consumer per poll call
_POLL_TIMEOUT_S = 0.05  # how long an idle poll waits; bounds delivery-report and stop latency


class Source(Protocol):
    assignment: set[TopicPartition]

    def subscribe(self, on_assign: Any, on_revoke: Any, on_lost: Any) -> None: ...
    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]: ...
    def store(self, watermarks: dict[TopicPartition, int]) -> None: ...
    def commit(self, watermarks: dict[TopicPartition, int]) -> None: ...
    def pause(self, tps: Any) -> None: ...
    def resume_all(self) -> None: ...
    @property
    def paused(self) -> bool: ...
    def close(self) -> None: ...


class Sink(Protocol):
    def produce(self, record: OutputRecord, on_delivery: Any) -> None: ...
    def poll(self, timeout_s: float = 0) -> int: ...
    def flush(self, timeout_s: float) -> int: ...


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

    def __init__(self, loaded: LoadedPipeline, source: Source, sink: Sink, engine: BatchEngine, *,
                 max_records: int | None = None, idle_exit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        p = loaded.pipeline
        self.pipeline = p
        self.source, self.sink, self.engine = source, sink, engine
        self.codec = RecordCodec(p.codec, p.sink.output)
        self.out_topic = p.sink.kafka.topic
        self.dlq_topic = p.dead_letter.topic if p.dead_letter else None
        self.max_records, self.idle_exit_s, self.clock = max_records, idle_exit_s, clock
        b = p.batching
        policy = BatchPolicy(max_batch_size=b.max_batch_size, max_queue_delay_s=b.max_queue_delay_ms / 1000,
                             bucket_by_length=b.bucket_by == "tokens", max_batch_tokens=b.max_batch_tokens,
                             bucket_width=b.bucket_width)
        self.state = SharedState(batcher=Batcher(policy), tracker=OffsetTracker())
        self.worker = EngineWorker(self.state, engine, self._settle, clock)
        self.summary = RunSummary()
        self._stop = threading.Event()
        self._fatal: str | None = None
        self._max_in_flight = p.runtime.max_in_flight
        self._resume_below = max(1, self._max_in_flight // 2)

    # ------------------------------------------------------------------------------------------- public

    def stop(self) -> None:
        """Ask for a graceful stop (safe from signal handlers and other threads)."""
        self._stop.set()

    def run(self) -> RunSummary:
        """Consume until stopped, then drain, flush, commit. The engine must already be started."""
        started = self.clock()
        self.worker.start()
        self.source.subscribe(self._on_assign, self._on_revoke, self._on_lost)
        last_store = last_record = started
        try:
            while not self._stop.is_set() and self._fatal is None and self.worker.error is None:
                self._backpressure()
                limit = _POLL_BATCH if self.max_records is None else min(_POLL_BATCH, self.max_records - self.summary.num_in)
                records = self.source.poll(limit, _POLL_TIMEOUT_S) if limit > 0 else []
                now = self.clock()
                if records:
                    self._intake(records, now)
                    last_record = now
                self.sink.poll(0)
                if now - last_store >= self.pipeline.runtime.commit_interval_ms / 1000:
                    with self.state.cond:
                        watermarks = self.state.tracker.watermarks()
                    self.source.store(watermarks)
                    last_store = now
                if self._finished(now, last_record):
                    break
        finally:
            self._shutdown()
        self.summary.elapsed_s = self.clock() - started
        self.summary.num_batches = self.state.num_batches
        self.summary.num_batched_records = self.state.num_batched_records
        self.summary.error = self._fatal or (repr(self.worker.error) if self.worker.error else None)
        return self.summary

    # ------------------------------------------------------------------------------------------- intake

    def _intake(self, records: list[InputRecord], now: float) -> None:
        s = self.state
        with s.cond:
            for r in records:
                s.tracker.track(r.tp, r.offset)
        self.summary.num_in += len(records)
        decoded: list[tuple[InputRecord, Any, Any]] = []
        rejected: list[tuple[InputRecord, str, BaseException]] = []
        for r in records:
            try:
                document, value = self.codec.decode(r.value)
                decoded.append((r, document, value))
            except CodecError as err:
                rejected.append((r, err.stage, err))
        accepted = self._prepare(decoded, rejected)
        with s.cond:
            for pending, length in accepted:
                s.batcher.add(pending, now, length)
            s.cond.notify_all()
        self._emit([(r, None, stage, err) for r, stage, err in rejected])

    def _prepare(self, decoded: list[tuple[InputRecord, Any, Any]],
                 rejected: list[tuple[InputRecord, str, BaseException]]) -> list[tuple[Pending, int]]:
        """Engine ``prepare`` for all records at once; one by one only when that fails."""
        engine = self.engine
        try:
            items = engine.prepare([v for _, _, v in decoded])
            return [(Pending(r, d, it), engine.item_length(it)) for (r, d, _), it in zip(decoded, items, strict=True)]
        except Exception:
            pass
        accepted = []
        for r, d, v in decoded:
            try:
                item = engine.prepare([v])[0]
                accepted.append((Pending(r, d, item), engine.item_length(item)))
            except Exception as err:  # RecordError, or an engine bug on this one input
                rejected.append((r, "prepare", err if isinstance(err, RecordError) else RecordError(repr(err))))
        return accepted

    # -------------------------------------------------------------------------------------- engine side

    def _settle(self, batch: list[Pending], outcomes: list[object]) -> None:
        """Engine thread: encode each result and produce it (or its dead-letter record)."""
        emits: list[tuple[InputRecord, OutputRecord | None, str, BaseException | None]] = []
        for pending, outcome in zip(batch, outcomes, strict=True):
            r = pending.record
            if isinstance(outcome, Failed):
                emits.append((r, None, "infer", outcome.error))
                continue
            try:
                value = self.codec.encode(pending.document, outcome)
                key = self.codec.output_key(pending.document, r.key)
            except CodecError as err:
                emits.append((r, None, err.stage, err))
                continue
            emits.append((r, OutputRecord(self.out_topic, value, key, source_headers(r)), "", None))
        self._emit(emits)

    def _emit(self, emits: list[tuple[InputRecord, OutputRecord | None, str, BaseException | None]]) -> None:
        """Produce outputs and dead-letter records, then release each record's processing reference."""
        if not emits:
            return
        plan: list[tuple[InputRecord, OutputRecord]] = []
        for r, out, stage, err in emits:
            if out is None:
                assert err is not None
                if self.dlq_topic is None:
                    self._fatal = (f"record {r.tp.topic}[{r.tp.partition}]@{r.offset} failed at {stage}: {err}; "
                                   "no dead_letter topic is configured, so the operator stops here without "
                                   "committing past it (configure dead_letter.topic to divert such records)")
                    continue  # never acked: the watermark stays before it
                out = dead_letter(r, self.dlq_topic, stage, err)
                log.debug("dead-lettering %s[%d]@%d at %s: %s", r.tp.topic, r.tp.partition, r.offset, stage, err)
            plan.append((r, out))
        s = self.state
        with s.cond:
            for r, _ in plan:
                s.tracker.expect(r.tp, r.offset)  # (2) before produce
        for r, out in plan:
            self.sink.produce(out, partial(self._delivered, r.tp, r.offset, out.topic == self.dlq_topic))
        with s.cond:
            for r, _ in plan:
                s.tracker.ack(r.tp, r.offset)  # processing over: only delivery reports remain

    def _delivered(self, tp: TopicPartition, offset: int, to_dlq: bool, err: Any, msg: Any) -> None:
        if err is not None:
            self._fatal = (f"could not deliver the output of {tp.topic}[{tp.partition}]@{offset} to "
                           f"{msg.topic()}: {err.str()}; stopping without committing past it")
            return
        if to_dlq:
            self.summary.num_dead_lettered += 1
        else:
            self.summary.num_out += 1
        with self.state.cond:
            self.state.tracker.ack(tp, offset)  # (3)

    # ----------------------------------------------------------------------------- flow and rebalances

    def _backpressure(self) -> None:
        in_flight = self.state.tracker.num_in_flight
        if in_flight >= self._max_in_flight and not self.source.paused:
            self.source.pause(self.source.assignment)
            log.debug("paused: %d records in flight", in_flight)
        elif self.source.paused and in_flight <= self._resume_below:
            self.source.resume_all()
            log.debug("resumed: %d records in flight", in_flight)

    def _on_assign(self, tps: list[TopicPartition]) -> None:
        log.info("assigned %s", _names(tps))
        if self.source.paused:  # a rebalance must not undo backpressure
            self.source.pause(tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        """Finish what is in flight for the revoked partitions, commit it, forget them.

        Records still queued in the batcher are dropped uncommitted: the next owner processes them, once.
        """
        log.info("revoking %s", _names(tps))
        revoked = set(tps)
        s = self.state
        with s.cond:
            s.batcher.remove(lambda p: p.record.tp in revoked)
            s.hold = True
            while s.busy and not s.stopped:
                s.cond.wait(0.1)
        self.sink.flush(self.pipeline.runtime.drain_timeout_s)
        with s.cond:
            watermarks = {tp: off for tp in tps if (off := s.tracker.committable(tp)) is not None}
            for tp in tps:
                s.tracker.forget(tp)
            s.hold = False
            s.cond.notify_all()
        self.source.commit(watermarks)

    def _on_lost(self, tps: list[TopicPartition]) -> None:
        log.warning("lost %s (another member owns them now); nothing of theirs will be committed", _names(tps))
        lost = set(tps)
        with self.state.cond:
            self.state.batcher.remove(lambda p: p.record.tp in lost)
            for tp in tps:
                self.state.tracker.forget(tp)

    # --------------------------------------------------------------------------------------- shutdown

    def _finished(self, now: float, last_record: float) -> bool:
        if self.max_records is not None and self.summary.num_in >= self.max_records:
            return True
        if self.idle_exit_s is None or now - last_record < self.idle_exit_s:
            return False
        with self.state.cond:
            return len(self.state.batcher) == 0 and not self.state.busy and self.state.tracker.is_idle()

    def _shutdown(self) -> None:
        """Stop taking records, drain in-flight batches within the drain timeout, flush, commit, close."""
        deadline = self.clock() + self.pipeline.runtime.drain_timeout_s
        s = self.state
        with s.cond:
            s.draining = True
            if self._fatal is not None:
                s.stopped = True
            s.cond.notify_all()
        while self.worker.is_alive() and self.clock() < deadline:
            self.sink.poll(0.05)  # serve delivery reports while the engine drains
        left = self.sink.flush(max(0.0, deadline - self.clock()))
        with s.cond:
            s.stopped = True
            s.cond.notify_all()
            watermarks = s.tracker.watermarks()
            unfinished = s.tracker.num_in_flight
        if left or unfinished:
            log.warning("drain timeout: %d records unfinished, %d deliveries outstanding; "
                        "they stay uncommitted and will be processed again", unfinished, left)
        self.source.commit(watermarks)
        self.source.close()


def _names(tps: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps, key=lambda t: (t.topic, t.partition)))
