"""The private OpenTelemetry TracerProvider of one runner, with the exporter the pipeline asks for.

Never the global provider: several pipelines (and tests) can run in one process, each with its own.
The provider's sampler is ALWAYS_ON because the operator makes the sampling decision itself (parent-based
ratio, see :mod:`sluice.telemetry.tracing`) and only asks the SDK for spans it decided to record.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from sluice.config import Tracing
from sluice.telemetry.errors import TelemetrySetupError

_DEFAULT_ENDPOINTS = {"grpc": "http://localhost:4317", "http": "http://localhost:4318/v1/traces"}


def build_provider(cfg: Tracing, service_name: str) -> TracerProvider:
    """A provider exporting to ``cfg.exporter`` (console or otlp) through a batching span processor."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}), sampler=ALWAYS_ON)
    provider.add_span_processor(BatchSpanProcessor(_exporter(cfg)))
    return provider


def _exporter(cfg: Tracing) -> SpanExporter:
    if cfg.exporter == "console":
        return ConsoleSpanExporter()
    if cfg.exporter != "otlp":
        raise TelemetrySetupError(f"tracing exporter {cfg.exporter!r} exports nothing; no provider is needed")
    endpoint = cfg.endpoint or _DEFAULT_ENDPOINTS[cfg.protocol]
    try:
        if cfg.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

            return Grpc(endpoint=endpoint)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http(endpoint=endpoint)
    except ImportError as err:
        raise TelemetrySetupError(f"the otlp exporter is not installed ({err}); "
                                "install it with: pip install 'sluice[telemetry]'") from None
