"""The private OpenTelemetry TracerProvider of one runner, with the exporter the pipeline asks for.

Never the global provider: several pipelines (and tests) can run in one process, each with its own.
The provider's sampler is ALWAYS_ON because the operator makes the sampling decision itself (parent-based
ratio, see :mod:`sluice.telemetry.tracing`) and only asks the SDK for spans it decided to record.
"""

from __future__ import annotations

import logging
import os
import threading

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from sluice.config import Tracing
from sluice.telemetry.otel_env import service_attributes
from sluice.telemetry.telemetry_error import TelemetrySetupError

log = logging.getLogger(__name__)

_EXPORT_TIMEOUT_S = 5  # one export to the collector (the SDK's default is 10)


def build_provider(cfg: Tracing, service_name: str) -> TracerProvider:
    """A provider exporting to ``cfg.exporter`` (console or otlp) through a batching span processor. Its
    resource: what the SDK reads from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, with
    ``service_name`` when those name no service."""
    resource = Resource.create(service_attributes(service_name, os.environ))
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
    provider.add_span_processor(BatchSpanProcessor(_exporter(cfg)))
    return provider


def shutdown_within(provider: TracerProvider, timeout_s: float = 2.0) -> None:
    """Flush and shut ``provider`` down, waiting at most ``timeout_s``: a collector that does not answer must
    not hold the process's exit (the spans still queued are dropped, and that is said)."""
    done = threading.Thread(target=provider.shutdown, name="sluice-trace-shutdown", daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        log.warning("tracing: the collector did not take the last spans within %.0f s; they are dropped",
                    timeout_s)


def _exporter(cfg: Tracing) -> SpanExporter:
    if cfg.exporter == "console":
        return ConsoleSpanExporter()
    if cfg.exporter != "otlp":
        raise TelemetrySetupError(f"tracing exporter {cfg.exporter!r} exports nothing; no provider is needed")
    # no endpoint: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else localhost:4317 / :4318
    try:
        if cfg.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

            return Grpc(endpoint=cfg.endpoint, timeout=_EXPORT_TIMEOUT_S)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http(endpoint=cfg.endpoint, timeout=_EXPORT_TIMEOUT_S)
    except ImportError as err:
        raise TelemetrySetupError(f"the otlp exporter is not installed ({err}); "
                                "install it with: pip install 'sluice[telemetry]'") from None
