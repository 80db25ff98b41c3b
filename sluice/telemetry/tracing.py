"""Per-record tracing through Kafka headers: W3C context in, a span tree for sampled records, context out.

Sampling is parent-based with a ratio: a record whose ``traceparent`` says *sampled* is recorded, one that
says *not sampled* is not, and a record without one starts a new trace recorded with probability
``sample_ratio``. Every output and dead-letter record gets a ``traceparent`` in its input's trace either
way (the input's ``traceparent`` header is replaced, ``tracestate`` passes through unchanged).

Two paths, decided once per record at poll time and kept in ``InputRecord.trace``:

* not sampled (the common case): ``trace`` is the ready-made header value (bytes) -- fresh ids come from
  :func:`new_traceparents` for the whole poll at once, so the per-record cost is a slice;
* sampled: ``trace`` is a :class:`_Sampled` holding the record's SDK span. Spans of a sampled record:
  ``process <topic>`` (CONSUMER, poll -> batch start, i.e. its queue delay) and ``send <topic>``
  (PRODUCER, a child, whose context goes into the output's header). A batch holding any sampled record
  gets ``batch`` (links to each sampled record's span) and its child ``infer`` (the engine call).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace import set_span_in_context as _in_context

from sluice.operator.record import InputRecord, Pending
from sluice.telemetry import traceparent as tp
from sluice.telemetry.traceparent import HEADER_LEN, TRACEPARENT, TraceParent


class _Sampled:
    """``InputRecord.trace`` of a recorded record: its consume span."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span


class RecordTracer:
    """Makes the tracing decisions and spans; the observer calls it from the runner's hooks."""

    def __init__(self, provider: TracerProvider, sample_ratio: float, *, group_id: str, engine_type: str,
                 seed: int | None = None) -> None:
        self.tracer = provider.get_tracer("sluice.operator")
        self.sample_ratio = sample_ratio
        self.group_id, self.engine_type = group_id, engine_type
        self._rng = np.random.default_rng(seed)
        self._wall_offset_s = time.time() - time.monotonic()  # monotonic (the runner's clock) -> wall time

    # ---------------------------------------------------------------------------------------- intake

    def polled(self, records: Sequence[InputRecord], now_s: float) -> None:
        """Decide each record's sampling, strip its incoming traceparent, keep what its outputs need."""
        n = len(records)
        fresh = np.frombuffer(tp.new_traceparents(n), dtype=f"S{HEADER_LEN}").tolist()  # n x bytes, in C
        with_headers = []
        for r, value in zip(records, fresh, strict=True):  # the common case: unsampled, no incoming context
            r.trace = value
            if r.headers:
                with_headers.append(r)
        for r in with_headers:
            self._take_context(r, r.trace)
        if self.sample_ratio > 0:
            for i in np.flatnonzero(self._rng.random(n) < self.sample_ratio).tolist():
                if records[i].trace is fresh[i]:  # no valid incoming context: a new trace, drawn
                    records[i].trace = self._start_record(records[i], None)

    def _take_context(self, r: InputRecord, fresh: bytes) -> None:
        """A record with headers: follow its traceparent if it has a valid one, and drop that header."""
        at, parent = tp.find(r.headers)
        if at >= 0:
            r.headers = r.headers[:at] + r.headers[at + 1:]  # the output gets the operator's instead
        if parent is None:
            return  # a new trace, like a record without headers
        if parent.sampled:
            r.trace = self._start_record(r, parent)
        else:  # same trace, a new span id, the parent's flags
            r.trace = b"00-%s-%s-%02x" % (parent.trace_id, fresh[36:52], parent.flags)

    def _start_record(self, r: InputRecord, parent: TraceParent | None) -> _Sampled:
        if parent is None:
            context = Context()  # a new trace, whatever span may be current on this thread
        else:
            remote = SpanContext(int(parent.trace_id, 16), int(parent.parent_id, 16), is_remote=True,
                                 trace_flags=TraceFlags(parent.flags))
            context = _in_context(NonRecordingSpan(remote), Context())
        span = self.tracer.start_span(
            f"process {r.tp.topic}", context=context, kind=SpanKind.CONSUMER, start_time=self._wall_ns(r.received_s),
            attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                        "messaging.destination.name": r.tp.topic,
                        "messaging.destination.partition.id": str(r.tp.partition),
                        "messaging.kafka.offset": r.offset, "messaging.consumer.group.name": self.group_id})
        return _Sampled(span)

    def rejected(self, records: Sequence[InputRecord], stages: Sequence[str]) -> None:
        """End the consume span of sampled records that failed before reaching a batch."""
        for r, stage in zip(records, stages, strict=True):
            t = r.trace
            if t.__class__ is _Sampled and t.span.is_recording():
                t.span.set_status(Status(StatusCode.ERROR, f"failed at {stage}"))
                t.span.end()

    # ---------------------------------------------------------------------------------------- engine

    def batch_started(self, batch: Sequence[Pending], now_s: float) -> Any:
        """End the batch's record spans (their queue delay ends here); open ``batch`` and ``infer``."""
        sampled = [t for p in batch if (t := p.record.trace).__class__ is _Sampled]
        if not sampled:
            return None
        start_ns = self._wall_ns(now_s)
        links = []
        for t in sampled:
            t.span.end(end_time=start_ns)
            links.append(Link(t.span.get_span_context()))
        attributes: dict[str, Any] = {"messaging.system": "kafka", "messaging.batch.message_count": len(batch),
                      "sluice.batch.num_sampled": len(sampled)}
        batch_span = self.tracer.start_span("batch", context=Context(), links=links, attributes=attributes,
                                            start_time=start_ns)
        infer_span = self.tracer.start_span(
            "infer", context=_in_context(batch_span, Context()), start_time=start_ns,
            attributes={"sluice.engine.type": self.engine_type, "messaging.batch.message_count": len(batch)})
        return batch_span, infer_span

    def batch_finished(self, handle: Any, num_failed: int) -> None:
        if handle is None:
            return
        batch_span, infer_span = handle
        infer_span.set_attribute("sluice.batch.num_failed", num_failed)
        if num_failed:
            infer_span.set_status(Status(StatusCode.ERROR, f"{num_failed} records failed"))
        infer_span.end()
        batch_span.end()

    # ---------------------------------------------------------------------------------------- output

    def output_headers(self, record: InputRecord, topic: str, stage: str | None) -> list[tuple[str, bytes]]:
        """The ``traceparent`` of one output (``stage`` set: a dead-letter record, failed at ``stage``)."""
        t = record.trace
        if t.__class__ is bytes:
            return [(TRACEPARENT, t)]
        if t.__class__ is not _Sampled:
            return []  # never seen by polled (cannot happen through the runner)
        if t.span.is_recording():  # no batch_started for it (a continuous engine): it ends at its output
            t.span.end()
        attributes: dict[str, Any] = {"messaging.system": "kafka", "messaging.operation.type": "send",
                                      "messaging.destination.name": topic}
        if stage is not None:
            attributes["sluice.dead_letter.stage"] = stage
        span = self.tracer.start_span(f"send {topic}", context=_in_context(t.span, Context()),
                                      kind=SpanKind.PRODUCER, attributes=attributes)
        span.end()
        sc = span.get_span_context()
        return [(TRACEPARENT, tp.format_traceparent(b"%032x" % sc.trace_id, b"%016x" % sc.span_id,
                                                    int(sc.trace_flags)))]

    def _wall_ns(self, monotonic_s: float) -> int:
        return int((monotonic_s + self._wall_offset_s) * 1e9)
