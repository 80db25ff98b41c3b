"""The intake: polled records become queued work for the engine thread, or dead letters.

Runs on the intake thread, once per poll. Records enter the operator here, and per-record containment
(sluice/operator/failures/containment.py) holds for each step that looks at one record's content: its headers and
trace context (the observer's ``polled``), decoding (sluice/operator/stalls.py, which holds back the
partitions whose records wait for the schema registry), the engine's ``prepare`` and ``item_length``. Each
either passes the record on or sends that record alone to the dead-letter topic (through the emitter).

Step by step, for one poll:

1. the ledger tracks every record (before anything can be produced for it);
2. the observer reads their headers; decode; ``prepare`` (all at once, one by one only to find the record a
   failure is about);
3. the prepared records go to the batcher, a batch's worth at a time, and the engine thread is woken each
   time; the rejected ones are emitted.
"""

from __future__ import annotations

import operator
from typing import Any

from sluice.engines.engine_contract import (
    BatchEngine,
    ContinuousEngine,
    EngineError,
    RecordError,
    RecordOrigin,
)
from sluice.operator.emitter import Emitter, Failure
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.operator.serving import Serving
from sluice.operator.stalls import Decoded, StallingDecoder
from sluice.operator.state import SharedState

MIN_CHUNK = 32  # small batches still prepare in chunks this large (tokenisers batch well; queueing costs a lock)


class Intake:
    """Decode, prepare, queue. Intake thread only."""

    def __init__(self, state: SharedState, decoder: StallingDecoder, serving: Serving, emitter: Emitter,
                 observer: Observer) -> None:
        self.state, self.decoder, self.emitter, self.observer = state, decoder, emitter, observer
        self.serving = serving  # whose ``prepare`` runs: the newest engine, from its hand-over on
        policy = state.batcher.policy
        self._measure = policy.bucket_by_length or policy.max_batch_tokens is not None  # need item lengths?
        self._chunk = max(policy.max_batch_size, MIN_CHUNK)  # records prepared and queued at a time

    def take(self, records: list[InputRecord], now: float) -> None:
        """Records just polled (the first step of every record's path)."""
        s = self.state
        with s.cond:
            s.ledger.track_many(records)
            s.summary.num_in += len(records)
            if s.summary.first_in_s is None and records:
                s.summary.first_in_s = now
        rejected: list[Failure] = []
        records = self._observe_polled(records, now, rejected)
        decoded, decode_rejected = self.decoder.decode(records, now)
        rejected.extend(decode_rejected)
        self._admit(decoded, rejected, now)

    def hand_over(self, serving: Serving) -> None:
        """A reloaded model is ready. Records go on being prepared by the serving engine until the engine
        thread has sealed what it prepared (``reload/switch.py``); :meth:`follow_switch` then moves on."""
        self.state.model_switch.offer(serving)

    def follow_switch(self) -> None:
        """Every pass: prepare with the new engine once the old one's records are sealed."""
        if (follow := self.state.model_switch.at_intake()) is not None:
            self.serving = follow

    def retry_stalled(self, now: float) -> bool:
        """Partitions waiting for the schema registry: retry those due; stop past the outage limit. True when
        a partition resumed (its later records come now)."""
        decoded, rejected, resumed = self.decoder.retry(now)
        if decoded or rejected:
            self._admit(decoded, rejected, now)
        expired = self.decoder.expired(now)
        if expired is not None:
            self.state.stop(expired)
        return bool(resumed)

    @property
    def has_stalls(self) -> bool:
        """Some partition waits for the schema registry."""
        return bool(self.decoder.stalls)

    def is_stalled(self, tp: TopicPartition) -> bool:
        """``tp`` is paused waiting for the schema registry (not for room)."""
        return tp in self.decoder.stalls

    def forget(self, tps: list[TopicPartition]) -> None:
        """Partitions gone: their held records stay uncommitted, their next owner processes them."""
        self.decoder.forget(tps)

    def start_over(self) -> None:
        """The consumer was rewound: held records are read again, their partitions resume."""
        self.decoder.resume(self.decoder.forget(self.decoder.stalls.partitions()))

    # ------------------------------------------------------------------------------------------ inner

    def _admit(self, decoded: list[Decoded], rejected: list[Failure], now: float) -> None:
        """Decoded records to the batcher (after ``prepare``), rejected ones to the dead-letter topic.

        A batch's worth at a time: the engine starts on the first batch while the rest of the poll is
        prepared (images are fetched and decoded here: a whole poll of them would idle the engine)."""
        s = self.state
        step = self._chunk
        for start in range(0, len(decoded), step):
            part = decoded[start : start + step]
            refused: list[Failure] = []
            accepted = self._prepare(part, refused)
            if (follow := s.queue(accepted, now)) is not None:  # the old engine's records were sealed meanwhile:
                self.serving = follow  # these are the new engine's, prepared again by it
                refused = []
                accepted = self._prepare(part, refused)
                s.queue(accepted, now)
            rejected += refused
        self.emitter.emit([], [], rejected, model=self.serving.header)

    def _observe_polled(self, records: list[InputRecord], now: float, rejected: list[Failure]) -> list[InputRecord]:
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

    def _prepare(self, decoded: list[Decoded], rejected: list[Failure]) -> list[tuple[Pending, int]]:
        """Engine ``prepare`` (and ``item_length``) for all records at once; one by one only when that fails,
        so that only the records it fails on alone are dead-lettered, with the engine's own exception (an engine
        may also give a record's exception in its place: ``prepare_each``)."""
        engine = self.serving.engine
        try:
            items = _prepare_values(engine, decoded)
            if len(items) != len(decoded):
                raise EngineError(f"prepare returned {len(items)} items for {len(decoded)} values")
        except Exception:
            items = [_prepare_one(engine, one) for one in decoded]
        accepted = []
        for (r, d, _), item in zip(decoded, items, strict=True):
            if isinstance(item, BaseException):  # RecordError, or anything else the engine raised on this input
                rejected.append((r, item.stage if isinstance(item, RecordError) else "prepare", item))
                continue
            try:
                length = _length(engine, item) if self._measure else 1
            except Exception as err:
                rejected.append((r, "prepare", err))
                continue
            accepted.append((Pending(r, d, item), length))
        return accepted


def _prepare_one(engine: BatchEngine | ContinuousEngine, decoded: Decoded) -> Any:
    """One record's item, or the exception preparing it alone raises."""
    try:
        items = _prepare_values(engine, [decoded])
        if len(items) != 1:
            raise EngineError(f"prepare returned {len(items)} items for one value")
        return items[0]
    except Exception as err:
        return err


def _prepare_values(engine: BatchEngine | ContinuousEngine, decoded: list[Decoded]) -> list[Any]:
    """``prepare`` of the records' values; a continuous engine is also told where each came from."""
    values = [v for _, _, v in decoded]
    if isinstance(engine, ContinuousEngine):
        return engine.prepare_records(values, [RecordOrigin(r.tp.topic, r.tp.partition, r.offset, r.key)
                                               for r, _, _ in decoded])  # fmt: skip
    return engine.prepare_each(values)


def _length(engine: BatchEngine | ContinuousEngine, item: Any) -> int:
    """``item_length`` as the batcher needs it: an integer of at least 1."""
    return max(1, operator.index(engine.item_length(item)))
