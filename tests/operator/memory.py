"""The operator tests' harness pipeline and run: the in-memory source and sink themselves are the public
:mod:`sluice.testing.memory_kafka` (users test their own pipelines with them), re-exported here."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.config import LoadedPipeline, parse_pipeline
from sluice.engines.engine_contract import BatchEngine, ContinuousEngine
from sluice.operator.observer import Observer
from sluice.operator.record import Headers
from sluice.operator.runner import Runner, RunSummary
from sluice.testing.memory_kafka import (  # noqa: F401  (the harness's names, for the tests that import them here)
    DeliveryError,
    EventLog,
    ManualClock,
    MemorySink,
    MemorySource,
    Produced,
    abortable,
)

TOPIC = "in"
PIPELINE = """
source: {kafka: {bootstrap_servers: "memory:0", topics: [in], group_id: g}}
codec: {format: json, input_field: text, max_record_bytes: 200000, max_depth: 32}
batching: {max_batch_size: 16, max_queue_delay_ms: 1, bucket_by: tokens}  # tokens: item_length is asked
engine: {type: python, function: "unused:unused"}
sink: {kafka: {topic: out}, output: {mode: merge, field: tagged}}
dead_letter: {topic: dlq, max_consecutive_failures: %s}
runtime: {max_in_flight: 1000, commit_interval_ms: 10, drain_timeout_s: 30}
"""


def pipeline(max_consecutive_failures: int | None = None, extra: str = "") -> LoadedPipeline:
    """The harness pipeline (codec bounds small enough to reach in a test), with ``extra`` YAML appended
    (a later key replaces an earlier one: ``extra`` may give a whole section again)."""
    threshold = "null" if max_consecutive_failures is None else str(max_consecutive_failures)
    return parse_pipeline(PIPELINE % threshold + extra, environ={})


def run(records: Sequence[tuple[bytes | None, bytes | None, Headers]], engine: BatchEngine | ContinuousEngine,
        loaded: LoadedPipeline | None = None, sink: MemorySink | None = None,
        observer: Observer | None = None) -> tuple[RunSummary, MemorySource, MemorySink]:
    """Run the real runner over ``records`` until all are consumed and drained; the engine is started here."""
    source, sink = MemorySource(records), sink or MemorySink()
    engine.start()
    runner = Runner(loaded or pipeline(), source, sink, engine, max_records=len(records), observer=observer)
    summary = runner.run()
    return summary, source, sink
