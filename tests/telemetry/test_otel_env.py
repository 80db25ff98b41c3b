"""The OpenTelemetry SDK's variables configure tracing where the pipeline is silent, and spans reach a
collector named only by them; a collector that never answers does not hold the exit."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sluice.config import Tracing, parse_pipeline
from sluice.telemetry import TelemetrySetupError, build_observer
from sluice.telemetry.otel_env import effective_tracing, service_attributes
from sluice.telemetry.provider import build_provider, shutdown_within
from tests.telemetry.test_observer import BASE


def test_the_environment_fills_only_what_the_pipeline_leaves_out() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
           "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert effective_tracing(Tracing(), env) == Tracing(exporter="otlp", protocol="http", sample_ratio=0.25)
    given = Tracing(exporter="console", sample_ratio=1.0)
    assert effective_tracing(given, env) == given  # the file wins key by key
    named = Tracing(exporter="otlp")
    assert effective_tracing(named, {}).protocol == "grpc"  # as before: the file named the exporter
    assert effective_tracing(named, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}).protocol == "http"
    assert effective_tracing(Tracing(), {"OTEL_TRACES_EXPORTER": "none",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).exporter == "none"
    assert effective_tracing(Tracing(), {"OTEL_TRACES_SAMPLER": "always_off"}).sample_ratio == 0.0
    assert effective_tracing(Tracing(), {}) == Tracing()  # nothing set: tracing stays off


@pytest.mark.parametrize(("env", "fragment"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "between 0 and 1"),
    ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER='jaeger_remote'"),
])
def test_values_sluice_cannot_honour_are_named(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(TelemetrySetupError, match=fragment.replace("(", r"\(")):
        effective_tracing(Tracing(), env)


def test_the_service_name_comes_from_the_environment_first() -> None:
    assert service_attributes("pipe", {}) == {"service.name": "pipe"}
    assert service_attributes("pipe", {"OTEL_SERVICE_NAME": "svc"}) == {}
    assert service_attributes("pipe", {"OTEL_RESOURCE_ATTRIBUTES": "team=a, service.name=svc"}) == {}


class Collector:
    """A local OTLP/HTTP receiver: keeps each export request it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    collector.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[tuple[str, str]]:
        """(service.name, span name) of every span received."""
        out = []
        for request in self.requests:
            for rs in request.resource_spans:
                service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
                out += [(service, span.name) for ss in rs.scope_spans for span in ss.spans]
        return out


def test_spans_reach_a_collector_named_only_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = Collector()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "reviews-enricher")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
        observer = build_observer(parse_pipeline(BASE + "telemetry: {status: off}\n").pipeline)
        assert observer.injects_headers  # tracing is on, from the environment alone
        with observer.tracer.tracer.start_as_current_span("probe"):  # type: ignore[attr-defined]
            pass
        observer.stopped()  # flushes
        assert ("reviews-enricher", "probe") in collector.spans()
    finally:
        collector.server.shutdown()


def test_a_collector_that_never_answers_holds_the_exit_at_most_two_seconds() -> None:
    provider = build_provider(Tracing(exporter="otlp", protocol="grpc", endpoint="http://10.255.255.1:4317"), "p")
    provider.get_tracer("t").start_span("s").end()
    started = time.monotonic()
    shutdown_within(provider, timeout_s=2.0)
    assert time.monotonic() - started < 3.0
