"""``telemetry``: tracing, metrics and health endpoints, the status line (sluice/telemetry/)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from sluice.config.base import Section


class Tracing(Section):
    # none: no tracing work at all, input headers (traceparent included) pass through unchanged.
    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str | None = None  # otlp: collector address; default per protocol (localhost:4317 / :4318)
    protocol: Literal["grpc", "http"] = "grpc"
    # Share of new traces recorded; a record with a traceparent follows its sampled flag instead. Every
    # output gets a traceparent in its input's trace either way; only sampled records cost SDK spans
    # (about 50 µs each in Python), so the default keeps them near 0.05 µs per record: 100 traces/s at
    # 100k records/s.
    sample_ratio: float = Field(default=0.001, ge=0, le=1)


class Metrics(Section):
    enabled: bool = False  # serve /metrics, /healthz and /readyz over HTTP
    host: str = "127.0.0.1"  # loopback unless opened up on purpose (0.0.0.0 in a container)
    port: int = Field(default=9464, ge=0, le=65535)  # 0 picks a free port (tests)


class Telemetry(Section):
    tracing: Tracing = Field(default_factory=Tracing)
    metrics: Metrics = Field(default_factory=Metrics)
    status: Literal["auto", "off"] = "auto"  # auto: a live line on a terminal, a log line every 10 s otherwise

    @field_validator("status", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false
