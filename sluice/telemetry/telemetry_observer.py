"""The telemetry observer: tracing, metrics, health endpoints and the status line behind the runner's hooks.

Built from the pipeline's ``telemetry`` section by :func:`sluice.telemetry.build_observer`. Each part is
optional and costs nothing when off: OpenTelemetry is imported only when tracing exports somewhere (or a
test injects a provider), prometheus_client only when metrics are enabled. Numbers are counted per poll,
per batch and per delivery (numpy over the batch), never with one Python call per record per metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from sluice.config import Pipeline
from sluice.engines.identity import ModelIdentity
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.operator.reload.outcome import ReloadOutcome
from sluice.telemetry.stats import OperatorStats
from sluice.telemetry.status import StatusReporter
from sluice.telemetry.traceparent import TRACEPARENT

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from sluice.telemetry.http import TelemetryServer
    from sluice.telemetry.tracing import RecordTracer

log = logging.getLogger(__name__)


class TelemetryObserver(Observer):
    """Feeds :class:`OperatorStats`, the record tracer, the status line; serves /metrics, /healthz, /readyz.

    The HTTP server (when enabled) starts in the constructor -- before the engine loads, so liveness
    answers during a long warm-up -- and stops in :meth:`stopped` (or :meth:`close` if the run never starts).
    """

    def __init__(self, pipeline: Pipeline, *, tracer_provider: TracerProvider | None = None,
                 status_stream: TextIO | None = None) -> None:
        cfg = pipeline.telemetry
        self.out_topic = pipeline.sink.destination
        self.dlq_topic = pipeline.dead_letter_destination
        self.stats = OperatorStats()
        self.counting = cfg.metrics.enabled or cfg.status != "off"
        self.status = StatusReporter(self.stats, status_stream) if cfg.status != "off" else None
        self.tracer: RecordTracer | None = None
        self._provider: TracerProvider | None = None  # owned here: shut down (flushed) on stop
        if tracer_provider is not None or cfg.tracing.exporter != "none":
            from sluice.telemetry.provider import build_provider
            from sluice.telemetry.tracing import RecordTracer

            if tracer_provider is None:
                tracer_provider = self._provider = build_provider(cfg.tracing, pipeline.name)
            self.tracer = RecordTracer(tracer_provider, cfg.tracing.sample_ratio,
                                       group_id=pipeline.source.group_id or "", engine_type=pipeline.engine.type)
            self.injects_headers = True
        self._engine: Any = None
        self._started_s: float | None = None  # when the run began (for the summary's wall time)
        self.batching: Any = None  # the adaptive batcher's latest decision (latency_target_ms only)
        self.server: TelemetryServer | None = None
        self.watchdog: Any = None  # the run's progress watchdog (sluice/operator/watchdog.py), once it runs
        self._stopping = False
        if cfg.metrics.enabled:
            from sluice.telemetry.http import TelemetryServer
            from sluice.telemetry.metrics import OperatorCollector, new_registry

            collector = OperatorCollector(self.stats, pipeline.name, engine_stats=self._engine_stats,
                                          batching=lambda: self.batching,
                                          stalls=self.stalls)
            self.registry = new_registry(collector)
            self.server = TelemetryServer(cfg.metrics.host, cfg.metrics.port, self.registry, self.readiness,
                                          self.health)

    # ------------------------------------------------------------------------------------- lifecycle

    def engine_started(self, engine: Any, warmup_s: float) -> None:
        self._engine = engine
        self.stats.warmup_s = warmup_s

    def model_serving(self, engine: Any, identity: ModelIdentity, warmup_s: float) -> None:
        self._engine = engine  # the LLM numbers are the serving engine's
        self.stats.models.record_serving(identity, warmup_s)

    def model_reloaded(self, outcome: ReloadOutcome) -> None:
        self.stats.models.record_reload(outcome)

    def stalls(self) -> dict[str, bool]:
        """Each watched part and whether it is stalled now (empty before the run starts)."""
        if self.watchdog is None:
            return {}
        stalled = {s.part for s in self.watchdog.check()}
        return {part: part in stalled for part in self.watchdog.parts}

    def health(self) -> str | None:
        """None while every part that owes work gets some done (a model load counts as progress), else
        which parts have stalled and for how long."""
        if self.watchdog is None:
            return None
        stalls = self.watchdog.check()
        return "; ".join(s.reason for s in stalls) if stalls else None

    def readiness(self) -> str | None:
        """None when ready (engine warmed up, a partition assigned, nothing stalled, not stopping), else why
        not."""
        if self._stopping:
            return "stopping"
        if self._engine is None:
            return "the engine is warming up"
        if self.stats.num_assigned == 0:
            return "no partition assigned yet"
        return self.health()

    def watching(self, watchdog: Any) -> None:
        self.watchdog = watchdog

    def bounded(self) -> None:
        if self.status is not None:
            self.status.bounded = True

    def started(self) -> None:
        self._started_s = time.monotonic()

    def assigned(self, tps: Sequence[TopicPartition]) -> None:
        self.stats.record_assignment(list(tps), [])

    def revoked(self, tps: Sequence[TopicPartition]) -> None:
        self.stats.record_assignment([], list(tps))

    def tick(self, now_s: float, num_in_flight: int, lag: dict[TopicPartition, int]) -> None:
        self.stats.record_tick(num_in_flight, lag)
        if self.status is not None:
            self.status.tick(now_s)

    def stopping(self) -> None:
        self._stopping = True

    def stopped(self) -> None:
        if self.status is not None:
            if self._started_s is not None:  # a run that began: say what it did
                self.status.finish(time.monotonic() - self._started_s, self._token_totals())
                self.summarised = True
            self.status.close()
        self.close()

    def close(self) -> None:
        """Flush spans, stop the HTTP server. Safe to call twice."""
        if self._provider is not None:
            from sluice.telemetry.provider import shutdown_within

            shutdown_within(self._provider)
            self._provider = None
        if self.server is not None:
            self.server.close()
            self.server = None

    # ----------------------------------------------------------------------------------- record flow

    def polled(self, records: Sequence[InputRecord], now_s: float) -> None:
        if self.tracer is not None:  # first: if a record's headers make it raise, the runner calls again
            self.tracer.polled(records, now_s)  # record by record, and nothing is counted twice
        if self.counting:
            self.stats.record_polled(len(records), now_s)

    def rejected(self, failures: Sequence[tuple[InputRecord, str, BaseException | None]]) -> None:
        stages = [stage for _, stage, _ in failures]
        if self.counting and self.dlq_topic is not None:  # without one, the operator stops instead
            self.stats.record_rejected(stages)
        if self.tracer is not None:
            self.tracer.rejected([r for r, _, _ in failures], stages)

    def stalled(self, tp: TopicPartition, reason: str, retry_in_s: float, first: bool) -> None:
        self.stats.record_stall(tp, first)

    def unstalled(self, tp: TopicPartition, stalled_s: float) -> None:
        self.stats.record_unstall(tp)

    def batch_started(self, batch: Sequence[Pending], now_s: float) -> Any:
        if self.counting:
            received = np.fromiter((p.record.received_s for p in batch), dtype=np.float64, count=len(batch))
            self.stats.record_batch(now_s - received)  # (num_records,) queue delays
        return self.tracer.batch_started(batch, now_s) if self.tracer is not None else None

    def batch_finished(self, handle: Any, batch: Sequence[Pending], infer_s: float, num_failed: int) -> None:
        if self.counting:
            self.stats.record_infer(infer_s)
        if self.tracer is not None:
            self.tracer.batch_finished(handle, num_failed)

    def batching_decided(self, decision: Any) -> None:
        self.batching = decision  # one reference swap: read at scrape time from the HTTP thread

    def output_headers(self, record: InputRecord, stage: str | None) -> list[tuple[str, bytes]]:
        t = record.trace
        if t.__class__ is bytes:  # unsampled: the ready-made header (the hot path, inlined)
            return [(TRACEPARENT, t)]
        assert self.tracer is not None  # the runner asks only when injects_headers, set with the tracer
        topic = self.out_topic if stage is None else (self.dlq_topic or "")
        return self.tracer.output_headers(record, topic, stage)

    def delivered(self, records: Sequence[InputRecord], num_dead_lettered: int, now_s: float) -> None:
        if self.counting:
            received = np.fromiter((r.received_s for r in records), dtype=np.float64, count=len(records))
            self.stats.record_delivered(len(records) - num_dead_lettered, now_s - received, now_s)

    # ------------------------------------------------------------------------------------------- LLM

    def _engine_stats(self) -> Any:
        return getattr(self._engine, "stats", None) if self._engine is not None else None

    def _token_totals(self) -> tuple[int, int] | None:
        """(prompt, output) tokens of an LLM engine so far; None for other engines."""
        stats = self._engine_stats()
        prompt, output = getattr(stats, "num_prompt_tokens", None), getattr(stats, "num_output_tokens", None)
        return None if prompt is None or output is None else (int(prompt), int(output))
