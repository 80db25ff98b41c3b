"""Building the telemetry observer from the pipeline's ``telemetry`` section."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sluice.config import ConfigError, parse_pipeline
from sluice.operator.observer import Observer
from sluice.telemetry import build_observer

BASE = """
source: {kafka: {bootstrap_servers: "127.0.0.1:1", topics: [in], group_id: g}}
engine: {type: python, function: "tests.integration.funcs:tag"}
sink: {kafka: {topic: out}}
"""


def test_all_off_builds_the_do_nothing_observer() -> None:
    loaded = parse_pipeline(BASE + "telemetry: {status: off}\n")
    assert type(build_observer(loaded.pipeline)) is Observer


def test_a_misspelt_telemetry_key_is_an_error_with_its_path() -> None:
    with pytest.raises(ConfigError, match=r"telemetry\.tracing\.sample_rate .*unknown key"):
        parse_pipeline(BASE + "telemetry: {tracing: {sample_rate: 0.5}}\n")
    with pytest.raises(ConfigError, match=r"telemetry\.tracing\.sample_ratio"):
        parse_pipeline(BASE + "telemetry: {tracing: {sample_ratio: 2}}\n")


def test_a_pipeline_without_tracing_or_metrics_imports_neither_library() -> None:
    code = textwrap.dedent(f"""
        import sys
        from sluice.config import parse_pipeline
        from sluice.telemetry import build_observer
        observer = build_observer(parse_pipeline({BASE!r}).pipeline)
        assert type(observer).__name__ == "TelemetryObserver" and not observer.injects_headers
        print(sorted({{m.split(".")[0] for m in sys.modules if m.startswith(("opentelemetry", "prometheus"))}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("tracing", ["{exporter: console}", "{exporter: otlp, protocol: http}",
                                     "{exporter: otlp, protocol: grpc, endpoint: 'http://127.0.0.1:1'}"])
def test_each_exporter_builds_a_private_provider(tracing: str) -> None:
    from opentelemetry import trace

    loaded = parse_pipeline(BASE + f"telemetry: {{tracing: {tracing}, status: off}}\n")
    observer = build_observer(loaded.pipeline)
    try:
        assert observer.injects_headers
        assert observer._provider is not None  # type: ignore[attr-defined]
        assert trace.get_tracer_provider() is not observer._provider  # type: ignore[attr-defined]
    finally:
        observer.stopped()
