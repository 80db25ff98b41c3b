"""``telemetry``: tracing, metrics and health endpoints, the status line (sluice/telemetry/)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from sluice.config.section import Section


class Tracing(Section):
    # none: no tracing work at all, input headers (traceparent included) pass through unchanged.
    exporter: Literal["none", "console", "otlp"] = "none"
    """`console`, `otlp`, or `none` (no tracing work; input headers pass through as they are). Left out:
    `OTEL_TRACES_EXPORTER`, or `otlp` when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set.
    Every key left out of this section is taken from the OpenTelemetry SDK's variables the same way."""
    endpoint: str | None = None
    """The OTLP collector (left out: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
    else `http://localhost:4317` for grpc, `http://localhost:4318/v1/traces` for http)."""
    protocol: Literal["grpc", "http"] = "grpc"
    """OTLP transport: `grpc` or `http` (left out: `OTEL_EXPORTER_OTLP_PROTOCOL`; else `grpc` when this
    section names the exporter, `http` when the environment turned tracing on)."""
    sample_ratio: float = Field(default=0.001, ge=0, le=1)
    """Share of new traces recorded; an incoming `traceparent` decides by its sampled flag. Every output
    carries a `traceparent`, sampled or not. Left out: from `OTEL_TRACES_SAMPLER` (and its `_ARG`)."""


class Metrics(Section):
    enabled: bool = False
    """Serve `/metrics` (Prometheus), `/healthz` and `/readyz` over HTTP."""
    host: str = "127.0.0.1"
    """The address the HTTP server binds (`0.0.0.0` to expose it from a container)."""
    port: int = Field(default=9464, ge=0, le=65535)
    """Its port (`0`: any free port)."""


class Telemetry(Section):
    tracing: Tracing = Field(default_factory=Tracing)
    """OpenTelemetry traces, one span per record, context in Kafka headers."""
    metrics: Metrics = Field(default_factory=Metrics)
    """Prometheus `/metrics` and the `/healthz` and `/readyz` endpoints."""
    status: Literal["auto", "off"] = "auto"
    """`auto`: a live status line on a terminal, a log line every 10 s otherwise; `off`."""

    @field_validator("status", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false
