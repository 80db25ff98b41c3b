"""The metrics/health server: what /metrics, /healthz and /readyz answer."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sluice.operator.record import TopicPartition
from sluice.telemetry.http import TelemetryServer
from sluice.telemetry.metrics import OperatorCollector, new_registry
from sluice.telemetry.stats import OperatorStats


class FakeLLMStats:
    num_running, num_waiting, kv_usage, num_preemptions = 3, 2, 0.5, 1


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_endpoints_serve_metrics_liveness_and_readiness() -> None:
    stats = OperatorStats()
    stats.record_polled(5)
    stats.record_batch(np.asarray([0.001, 0.002, 0.003]))
    stats.record_delivered(4, np.asarray([0.01] * 5))
    stats.record_rejected(["decode"])
    stats.record_tick(0, {TopicPartition("in", 2): 42})
    reason: list[str | None] = ["the engine is warming up"]
    server = TelemetryServer("127.0.0.1", 0, new_registry(OperatorCollector(stats, "p", lambda: FakeLLMStats())),
                             lambda: reason[0])
    try:
        assert get(server.port, "/healthz") == (200, "ok\n")
        assert get(server.port, "/readyz") == (503, "not ready: the engine is warming up\n")
        reason[0] = None
        assert get(server.port, "/readyz")[0] == 200
        code, body = get(server.port, "/metrics")
        assert code == 200
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(body) for s in f.samples}
        p = (("pipeline", "p"),)
        assert samples[("sluice_records_in_total", p)] == 5
        assert samples[("sluice_records_out_total", p)] == 4
        assert samples[("sluice_records_dead_lettered_total", (("pipeline", "p"), ("stage", "decode")))] == 1
        assert samples[("sluice_queue_delay_seconds_count", p)] == 3
        assert samples[("sluice_end_to_end_latency_seconds_bucket", (("le", "+Inf"), ("pipeline", "p")))] == 5
        assert samples[("sluice_consumer_lag_records", (("partition", "2"), ("pipeline", "p"), ("topic", "in")))] == 42
        m = (("digest", ""), ("engine", ""), ("model", ""), ("pipeline", "p"))  # the serving model (none here)
        assert samples[("sluice_llm_requests_running", m)] == 3
        assert samples[("sluice_llm_kv_cache_usage_ratio", m)] == 0.5
        assert get(server.port, "/nope")[0] == 404
    finally:
        server.close()


def test_adaptive_batching_decisions_are_exported_once_there_is_one() -> None:
    from prometheus_client import generate_latest

    from sluice.operator.adaptive import Decision

    decision: list[Decision | None] = [None]
    registry = new_registry(OperatorCollector(OperatorStats(), "p", batching=lambda: decision[0]))
    assert b"sluice_adaptive" not in generate_latest(registry)  # static batching: no such gauges
    decision[0] = Decision(dispatch_now=False, size=24, wake_at_s=1.5, service_s=0.031, rate_per_s=410.0)
    samples = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples["sluice_adaptive_batch_size_records"] == 24
    assert samples["sluice_adaptive_predicted_service_seconds"] == 0.031
