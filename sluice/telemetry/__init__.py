"""Tracing (W3C context in Kafka headers), Prometheus metrics, health endpoints and the live status line.

Importing this package imports neither OpenTelemetry nor prometheus_client; :func:`build_observer` pulls
in only what the pipeline's ``telemetry`` section turns on.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TextIO

from sluice.config import Pipeline
from sluice.operator.observer import Observer
from sluice.telemetry.otel_env import effective_tracing
from sluice.telemetry.telemetry_error import TelemetrySetupError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["TelemetrySetupError", "build_observer"]


def build_observer(pipeline: Pipeline, *, tracer_provider: TracerProvider | None = None,
                   status_stream: TextIO | None = None) -> Observer:
    """The observer for ``pipeline``: a do-nothing :class:`Observer` when telemetry is all off.

    ``tracer_provider`` replaces the exporter the config names (tests pass one with an in-memory exporter);
    it turns tracing on even with ``exporter: none``. Starts the metrics/health server when enabled.
    """
    cfg = pipeline.telemetry
    tracing = effective_tracing(cfg.tracing, os.environ)  # the OTEL_* variables fill what the file leaves out
    if tracing is not cfg.tracing:
        cfg = cfg.model_copy(update={"tracing": tracing})
        pipeline = pipeline.model_copy(update={"telemetry": cfg})
    if tracer_provider is None and cfg.tracing.exporter == "none" and not cfg.metrics.enabled and cfg.status == "off":
        return Observer()
    from sluice.telemetry.telemetry_observer import TelemetryObserver

    return TelemetryObserver(pipeline, tracer_provider=tracer_provider, status_stream=status_stream)

