"""The output side: results become output records (or dead-letter records), are produced, and their
delivery reports acknowledge the inputs in the in-flight ledger.

``settle`` runs on the engine thread (a finished batch); ``emit`` also on the intake thread (records that
failed to decode). Delivery reports arrive on the intake thread, the only one that polls the producer.
The ledger decides what may be produced now (in input order under exactly-once) and, once delivered, which
offsets the delivery strategy may commit (sluice/operator/delivery/).

Per-record containment (sluice/operator/failures/containment.py) holds here too: whatever fails while one result
becomes its output record (encoding, the output key, headers and trace context, the size check) sends
that record alone to the dead-letter topic; and ``emit`` counts the failures in a row, stopping the
operator at ``dead_letter.max_consecutive_failures``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError

from sluice.codecs.record_codec import CodecError, RecordCodec
from sluice.config import Pipeline
from sluice.engines.identity import MODEL_HEADER
from sluice.operator.failures.bisection import Failed
from sluice.operator.failures.containment import ConsecutiveFailures, error_text
from sluice.operator.failures.dead_letter import dead_letter, source_headers
from sluice.operator.observer import Observer
from sluice.operator.ports import ProduceFailed, Sink
from sluice.operator.record import InputRecord, Pending, message_bytes
from sluice.operator.state import SharedState

log = logging.getLogger(__name__)

Output = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]  # topic, value, key, headers
Failure = tuple[InputRecord, str, BaseException | None]  # record, stage, error


class OversizedResult(Exception):
    """A result is larger than the output topic accepts."""


class _Delivery:
    """Delivery-report callback shared by all records produced together (one batch, or one poll's rejects).

    Called by librdkafka once per produced record, on the thread that serves delivery reports (the intake
    thread: the engine thread never polls the producer), so ``left`` needs no lock.
    """

    __slots__ = ("emitter", "records", "left", "num_dead_lettered", "sent_s")

    def __init__(self, emitter: Emitter, records: list[InputRecord], sent_s: float) -> None:
        self.emitter = emitter
        self.records = records  # the inputs whose outputs this delivery carries
        self.left = 0
        self.num_dead_lettered = 0
        self.sent_s = sent_s  # when its records were handed to the producer

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.emitter.delivery_failed(err, msg, self)  # never acked: nothing past its inputs is committed
            return
        self.left -= 1
        if self.left == 0:
            self.emitter.delivered(self)


class Emitter:
    """Encodes, produces and acknowledges. A failure that must stop the operator becomes the state's stop
    reason (:meth:`SharedState.stop <sluice.operator.state.SharedState.stop>`)."""

    def __init__(self, pipeline: Pipeline, sink: Sink, codec: RecordCodec, state: SharedState, observer: Observer,
                 clock: Callable[[], float]) -> None:
        self.sink, self.codec, self.state, self.observer, self.clock = sink, codec, state, observer, clock
        self.summary = state.summary
        self.out_topic = pipeline.sink.destination  # a topic, or a file sink's output path
        self.dlq_topic = pipeline.dead_letter_destination
        self.keep_key = pipeline.sink.output.key == "input"
        # produced and not yet all delivered, oldest first (registered under the state's lock, with the time)
        self._undelivered: dict[int, _Delivery] = {}
        # replaced by the topics' own limits in read_topic_limits
        self.max_output_bytes = self.max_dead_letter_bytes = 1_000_000
        self.failures = ConsecutiveFailures(pipeline.dead_letter.max_consecutive_failures
                                            if pipeline.dead_letter else None)

    def read_topic_limits(self) -> None:
        self.max_output_bytes = self.sink.max_message_bytes(self.out_topic)
        if self.dlq_topic is not None:
            self.max_dead_letter_bytes = (self.max_output_bytes if self.dlq_topic == self.out_topic
                                          else self.sink.max_message_bytes(self.dlq_topic))

    def settle(self, batch: list[Pending], outcomes: list[object], model: bytes | Sequence[bytes]) -> None:
        """Engine thread: encode each result and produce it (or its dead-letter record).

        ``model``: the ``sluice.model`` header of the model that ran the batch (or one per record).
        Records enter the output side here, one by one: any exception while one becomes its output record
        dead-letters that record alone, at the stage it was in.
        """
        codec, topic, limit = self.codec, self.out_topic, self.max_output_bytes
        injects_headers = self.observer.injects_headers
        outputs: list[Output] = []
        records: list[InputRecord] = []
        failed: list[Failure] = []
        failed_models: list[bytes] = []
        order: list[bool] = []  # per record, in batch order: did it make it? (for the failures in a row)
        models = [model] * len(batch) if isinstance(model, bytes) else model
        for pending, outcome, made_by in zip(batch, outcomes, models, strict=True):
            r = pending.record
            if isinstance(outcome, Failed):
                failed.append((r, "infer", outcome.error))
                failed_models.append(made_by)
                order.append(False)
                continue
            stage = "encode"
            try:
                value = codec.encode(pending.document, outcome)
                key = r.key if self.keep_key else codec.output_key(pending.document, r.key)
                stage = "headers"
                headers = source_headers(r)
                headers.append((MODEL_HEADER, made_by))
                if injects_headers:
                    headers += self.observer.output_headers(r, None)
                stage = "produce"
                if len(value) > limit - 4096 and (size := message_bytes(value, key, headers)) > limit:
                    raise OversizedResult(f"the output is {size} bytes; topic {topic} accepts at most {limit} "
                                          "(raise its max.message.bytes, or shrink the result)")
            except Exception as err:  # about this record alone (containment.py)
                failed.append((r, err.stage if isinstance(err, CodecError) else stage, err))
                failed_models.append(made_by)
                order.append(False)
                continue
            outputs.append((topic, value, key, headers))
            records.append(r)
            order.append(True)
        self.emit(records, outputs, failed, order if failed else None, failed_models)

    def emit(self, records: list[InputRecord], outputs: list[Output], failed: list[Failure],
             order: list[bool] | None = None, model: bytes | Sequence[bytes] = b"") -> None:
        """Produce ``outputs`` (one per record in ``records``) and dead-letter records for ``failed``; the
        inputs are acked together once every one of them is delivered. Under exactly-once the ledger holds
        each output back until every earlier record of its partition has been produced
        (sluice/operator/ledger.py). ``model``: the ``sluice.model`` header of the dead letters (the model
        that failed them, or was serving when they failed before reaching it), one for all or one each.

        ``order``: True (an output) or False (a failure) per record, in the order they were settled
        (default: the outputs, then the failures). When ``dead_letter.max_consecutive_failures`` records in
        a row have failed, the operator stops: the failure that reached the threshold and every later one
        are not dead-lettered, and stay uncommitted for a run that has been fixed."""
        num_results = len(outputs)
        if failed:
            self._observe_rejected(failed)
            with self.state.cond:
                allowed = self.failures.observe(order if order is not None
                                                else [True] * num_results + [False] * len(failed))
            if allowed < len(failed):
                self._stop_on_failures(failed[allowed])  # the first record refused says why
                failed = failed[:allowed]
        elif num_results:
            with self.state.cond:
                self.failures.observe((True,))
        models = [model] * len(failed) if isinstance(model, bytes) else model
        for (r, stage, err), made_by in zip(failed, models, strict=False):  # failed may have been cut
            if self.dlq_topic is None:
                self.state.stop(f"record {r.tp.topic}[{r.tp.partition}]@{r.offset} failed at {stage}: "
                                f"{_one_line(err or 'unknown error')}; no dead_letter topic is configured, so the "
                                "operator stops here without committing past it (configure dead_letter.topic to "
                                "divert such records)")
                continue  # never acked: the watermark stays before it
            # room for the trace header the observer may add, and for the model's
            out = dead_letter(r, self.dlq_topic, stage, err or "unknown error",
                              self.max_dead_letter_bytes - 256 - len(made_by))
            if made_by:
                out.headers.append((MODEL_HEADER, made_by))
            log.debug("dead-lettering %s[%d]@%d at %s: %s", r.tp.topic, r.tp.partition, r.offset, stage,
                      _one_line(err or "unknown error"))
            if self.observer.injects_headers:
                try:
                    out.headers.extend(self.observer.output_headers(r, stage))
                except Exception as trace_err:  # the record goes to the dead letters all the same
                    log.warning("no trace context for the dead letter of %s[%d]@%d: %s", r.tp.topic,
                                r.tp.partition, r.offset, _one_line(trace_err))
            records.append(r)
            outputs.append((out.topic, out.value, out.key, out.headers))
        if not outputs:
            return
        with self.state.cond:  # in order under exactly-once (sluice/operator/ledger.py)
            released, outputs, num_dead = self.state.ledger.release(records, outputs, num_results)
            if not outputs:
                return
            delivery = _Delivery(self, released, self.clock())
            self._undelivered[id(delivery)] = delivery
        delivery.num_dead_lettered = num_dead
        delivery.left = len(outputs)  # set before the first produce can be reported
        produce = self.sink.produce
        try:
            for topic, value, key, headers in outputs:
                produce(topic, value, key, headers, delivery)
        except ProduceFailed as err:  # none of this batch is acked, so nothing past it is committed
            self.state.stop(f"{err}; stopping without committing past this batch's inputs")

    def _observe_rejected(self, failed: list[Failure]) -> None:
        try:
            self.observer.rejected(failed)
        except Exception as err:  # telemetry about failed records must not add a failure of its own
            log.warning("the observer failed on %d rejected records: %s", len(failed), _one_line(err))

    def _stop_on_failures(self, last: Failure) -> None:
        r, stage, err = last
        self.state.stop(f"{self.failures.run} records in a row failed (the last, {r.tp.topic}[{r.tp.partition}]"
                        f"@{r.offset}, at {stage}: {_one_line(err or 'unknown error')}); that many point at the "
                        "engine, the codec or the input rather than at single records, so the operator stops "
                        "without committing past them (dead_letter.max_consecutive_failures sets how many)")

    def delivered(self, delivery: _Delivery) -> None:
        """Intake thread, from a delivery report: every output of ``delivery`` is on the broker."""
        now = self.clock()
        self.summary.num_out += len(delivery.records) - delivery.num_dead_lettered
        self.summary.num_dead_lettered += delivery.num_dead_lettered
        self.summary.last_out_s = now
        with self.state.cond:
            self.state.ledger.ack_many(delivery.records)
            self._undelivered.pop(id(delivery), None)
        self.observer.delivered(delivery.records, delivery.num_dead_lettered, now)

    def oldest_undelivered_s(self) -> float | None:
        """When the oldest output still waiting for its delivery report was produced (None: none waits).
        Any thread."""
        with self.state.cond:
            oldest = next(iter(self._undelivered.values()), None)
        return None if oldest is None else oldest.sent_s

    def delivery_failed(self, err: Any, msg: Any, delivery: _Delivery) -> None:
        if err.code() in _PURGED:
            # Aborting a transaction (or replacing the producer after an ambiguous one) purges what is not yet
            # delivered; those records were forgotten and the consumer rewound, so they are processed again.
            log.debug("delivery to %s purged: %s", msg.topic(), err.str())
            with self.state.cond:
                self._undelivered.pop(id(delivery), None)
            return
        self.state.stop(f"could not deliver a record to {msg.topic()}: {err.str()}; "
                        "stopping without committing past its input")


_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


def _one_line(err: BaseException | str, max_chars: int = 300) -> str:
    """``Class: message`` on one short line, for logs and stop messages."""
    cls, message = error_text(err)
    text = " ".join(message.split())
    text = text if len(text) <= max_chars else text[:max_chars] + "..."
    return text if isinstance(err, str) else f"{cls}: {text}"
