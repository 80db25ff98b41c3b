"""Every metric follows Prometheus' naming conventions, and the Grafana dashboard queries only metrics that
exist (the live check is in tests/integration/test_telemetry_kafka.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.support.metric_lint import dashboard_metrics, every_part_scrape, exposed, lint


def test_every_exported_metric_follows_the_naming_rules() -> None:
    scraped = every_part_scrape()
    assert {f.name for f in scraped} >= {"sluice_records_in", "sluice_llm_output_tokens", "sluice_model_info",
                                         "sluice_progress_stalled", "process_resident_memory_bytes"}
    assert lint(scraped) == []


def test_the_lint_catches_what_the_conventions_forbid() -> None:
    body = ('# TYPE sluice_fill_ms_per_step gauge\nsluice_fill_ms_per_step{pipeline="p"} 1.0\n'
            '# TYPE sluice_batches counter\nsluice_batches_total{model="m@sha256:0 (onnx)",reason="x y"} 1.0\n')
    problems = "\n".join(lint(list(text_string_to_metric_families(body))))
    assert "sluice_fill_ms_per_step: ['ms', 'per']" in problems
    assert "label model='m@sha256:0 (onnx)' is free text" in problems and "unexpected label 'reason'" in problems


def test_the_dashboard_queries_only_metrics_the_collector_exports() -> None:
    names = exposed(every_part_scrape())
    panels = dashboard_metrics()
    assert len(panels) >= 10
    missing = {title: used - names for title, used in panels.items() if used - names}
    assert missing == {}
