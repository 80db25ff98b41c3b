"""Sampling decisions, header propagation and the span tree of RecordTracer (in-memory exporter)."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.telemetry.traceparent import parse
from sluice.telemetry.tracing import RecordTracer

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = b"00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer(exporter: InMemorySpanExporter, ratio: float, seed: int = 1) -> RecordTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RecordTracer(provider, ratio, group_id="g", engine_type="python", seed=seed)


def record(offset: int, headers: list[tuple[str, bytes]] | None = None) -> InputRecord:
    return InputRecord(b"{}", None, headers or [], TopicPartition("in", 0), offset, None, time.monotonic())


def out_parent(t: RecordTracer, r: InputRecord, stage: str | None = None):  # noqa: ANN201
    headers = t.output_headers(r, "out", stage)
    assert [k for k, _ in headers] == ["traceparent"]
    parent = parse(headers[0][1])
    assert parent is not None, headers
    return parent


def test_incoming_sampled_flag_is_followed_and_outputs_join_its_trace(exporter: InMemorySpanExporter) -> None:
    t = tracer(exporter, ratio=0.0)
    sampled, unsampled = record(0, [("traceparent", SAMPLED)]), record(1, [("traceparent", UNSAMPLED)])
    t.polled([sampled, unsampled], time.monotonic())
    assert sampled.headers == [] and unsampled.headers == []  # the operator's traceparent replaces theirs

    handle = t.batch_started([Pending(sampled, None, None), Pending(unsampled, None, None)], time.monotonic())
    t.batch_finished(handle, 0)
    out_sampled, out_unsampled = out_parent(t, sampled), out_parent(t, unsampled)

    assert out_sampled.trace_id == SAMPLED[3:35] and out_sampled.sampled
    assert out_unsampled.trace_id == UNSAMPLED[3:35] and not out_unsampled.sampled
    assert out_unsampled.parent_id != UNSAMPLED[36:52]  # a span of its own, not the upstream one
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"process in", "batch", "infer", "send out"}  # nothing for the unsampled record
    consume, send, batch = spans["process in"], spans["send out"], spans["batch"]
    assert consume.parent is not None and consume.parent.span_id == int(SAMPLED[36:52], 16)
    assert send.parent is not None and send.parent.span_id == consume.context.span_id
    assert out_sampled.parent_id == b"%016x" % send.context.span_id
    assert [link.context.span_id for link in batch.links] == [consume.context.span_id]
    assert batch.attributes is not None and batch.attributes["messaging.batch.message_count"] == 2
    assert spans["infer"].parent is not None and spans["infer"].parent.span_id == batch.context.span_id
    assert consume.attributes is not None and consume.attributes["messaging.kafka.offset"] == 0


def test_records_without_context_start_new_traces_at_the_sample_ratio(exporter: InMemorySpanExporter) -> None:
    n = 4000
    t = tracer(exporter, ratio=0.25, seed=3)
    records = [record(i) for i in range(n)]
    t.polled(records, time.monotonic())
    parents = [out_parent(t, r) for r in records]
    num_sampled = sum(p.sampled for p in parents)
    assert 0.22 * n < num_sampled < 0.28 * n
    assert len({p.trace_id for p in parents}) == n  # one new trace per record
    assert len([s for s in exporter.get_finished_spans() if s.name == "send out"]) == num_sampled


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_ratio_zero_records_nothing_and_one_records_everything(exporter: InMemorySpanExporter,
                                                                ratio: float) -> None:
    t = tracer(exporter, ratio)
    records = [record(i) for i in range(50)]
    t.polled(records, time.monotonic())
    assert all(out_parent(t, r).sampled == (ratio == 1.0) for r in records)
    assert len(exporter.get_finished_spans()) == (100 if ratio == 1.0 else 0)  # a consume and a send span each


def test_malformed_traceparent_is_dropped_and_a_new_trace_starts(exporter: InMemorySpanExporter) -> None:
    t = tracer(exporter, ratio=0.0)
    r = record(0, [("traceparent", b"00-zz-bad"), ("tracestate", b"vendor=1")])
    t.polled([r], time.monotonic())
    assert r.headers == [("tracestate", b"vendor=1")]  # tracestate passes through untouched
    assert out_parent(t, r).trace_id != b"zz"


def test_a_dead_letter_record_joins_the_trace_and_its_consume_span_ends(exporter: InMemorySpanExporter) -> None:
    t = tracer(exporter, ratio=1.0)
    r = record(0)
    t.polled([r], time.monotonic())
    t.rejected([r], ["decode"])
    out = out_parent(t, r, stage="decode")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["process in"].status.is_ok is False
    assert spans["send out"].attributes is not None and spans["send out"].attributes["sluice.dead_letter.stage"] == "decode"
    assert out.trace_id == b"%032x" % spans["process in"].context.trace_id


def test_records_with_other_headers_but_no_context_are_sampled_like_the_rest(exporter: InMemorySpanExporter) -> None:
    t = tracer(exporter, ratio=1.0)
    r = record(0, [("x-app", b"1")])
    t.polled([r], time.monotonic())
    assert r.headers == [("x-app", b"1")]
    assert out_parent(t, r).sampled


def test_without_a_batch_start_the_consume_span_ends_at_the_output(exporter: InMemorySpanExporter) -> None:
    t = tracer(exporter, ratio=1.0)  # continuous engines report batch_finished only
    r = record(0)
    t.polled([r], time.monotonic())
    t.batch_finished(None, 0)
    out_parent(t, r)
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["process in", "send out"]
