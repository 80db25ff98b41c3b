"""The model label on the engine metrics and the reload metrics (sluice/telemetry/model_stats.py, metrics.py)."""

from __future__ import annotations

import numpy as np
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluice.engines.identity import ModelIdentity
from sluice.operator.reload.outcome import ReloadOutcome
from sluice.telemetry.metrics import OperatorCollector, new_registry
from sluice.telemetry.stats import OperatorStats


class FakeLLMStats:
    num_running, num_output_tokens = 2, 40


def samples(stats: OperatorStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = generate_latest(new_registry(OperatorCollector(stats, "p", lambda: FakeLLMStats()))).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline"))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def test_engine_metrics_are_kept_per_model_across_a_reload() -> None:
    old = ModelIdentity("embedder", "a" * 64, "onnx")
    new = ModelIdentity("embedder", "b" * 64, "onnx")
    stats = OperatorStats()
    stats.models.record_serving(old, 2.5)
    for size in (3, 5):
        stats.record_batch(np.zeros(size))
        stats.record_infer(0.01)
    stats.models.record_reload(ReloadOutcome("failed", new, 0.3, "start",
                                             "engine 'onnx': cannot load ONNX model"))
    stats.models.record_reload(ReloadOutcome("ready", new, 1.0))
    stats.models.record_serving(new, 1.0)
    stats.record_batch(np.zeros(7))
    stats.record_infer(0.02)
    s = samples(stats)
    # name, short digest and engine, each its own label (no spaces or parentheses in a label value)
    a = (("digest", "a" * 12), ("engine", "onnx"), ("model", "embedder"))
    b = (("digest", "b" * 12), ("engine", "onnx"), ("model", "embedder"))
    assert s[("sluice_batches_total", a)] == 2 and s[("sluice_batches_total", b)] == 1
    assert s[("sluice_batch_size_records_sum", a)] == 8 and s[("sluice_batch_size_records_sum", b)] == 7
    assert s[("sluice_inference_seconds_count", a)] == 2 and s[("sluice_inference_seconds_count", b)] == 1
    assert s[("sluice_engine_warmup_seconds", a)] == 2.5 and s[("sluice_engine_warmup_seconds", b)] == 1.0
    assert s[("sluice_queue_delay_seconds_count", ())] == 15  # operator metrics stay unlabelled
    info = (*b, ("sha256", "b" * 64))
    assert s[("sluice_model_info", info)] == 1 and len([k for k in s if k[0] == "sluice_model_info"]) == 1
    assert s[("sluice_model_reloads_total", (("result", "ready"),))] == 1
    assert s[("sluice_model_reloads_total", (("result", "failed"),))] == 1
    assert s[("sluice_model_reloads_total", (("result", "unchanged"),))] == 0
    assert s[("sluice_model_reload_failures_total", (("stage", "start"),))] == 1
    (last,) = [k for k in s if k[0] == "sluice_model_reload_last_failure_timestamp_seconds"]
    assert dict(last[1]) == {**dict(b), "stage": "start"}  # the reason is free text: in the log, not a label
    assert s[("sluice_llm_requests_running", b)] == 2  # the LLM numbers are the serving model's


def test_before_any_model_serves_there_are_no_model_series() -> None:
    s = samples(OperatorStats())
    assert not [k for k in s if k[0].startswith(("sluice_model_", "sluice_batches"))]
