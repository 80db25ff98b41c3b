"""Prometheus exposition of :class:`OperatorStats` (and of an LLM engine's own numbers) on a private registry.

A custom collector reads the stats at scrape time, so the hot path never calls prometheus_client. Each
runner gets its own ``CollectorRegistry`` (never the global one): several pipelines can run in one process.

Naming follows Prometheus' conventions, checked by a lint over a scrape (tests/telemetry/test_metric_names.py):
base units (seconds, bytes), counters for whatever grows (a dashboard takes ``rate()``; nothing here is a
precomputed rate or a ratio of two counters), label values from a bounded set -- never free text.

Engine metrics (batches, batch sizes, inference time, warm-up, the LLM's) carry the serving model as three
labels: ``model`` (its name), ``digest`` (the first 12 hex digits of its content digest) and ``engine``
(sluice/engines/identity.py), so a dashboard tells the models of a reload apart. ``sluice_model_info``
names the serving model (with its full digest as ``sha256``); ``sluice_model_reloads``,
``sluice_model_reload_failures`` and ``sluice_model_reload_last_failure_timestamp_seconds`` tell how
reloads went (the failure's reason is in the log).

LLM engines: an engine whose ``stats`` attribute (or property) returns an object with any of the fields of
``_LLM_FIELDS`` gets those exported too (fields it lacks are skipped).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.engines.identity import parse_label
from sluice.telemetry.histogram import HistogramSnapshot
from sluice.telemetry.model_stats import ModelsSnapshot
from sluice.telemetry.stats import OperatorStats

log = logging.getLogger(__name__)

MODEL_LABELS = ["model", "digest", "engine"]  # the serving model, on every engine metric

# LLM engine stats fields -> (metric name, kind, help)
_LLM_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("num_running", "sluice_llm_requests_running", "gauge", "LLM requests being decoded or prefilled"),
    ("num_waiting", "sluice_llm_requests_waiting", "gauge", "LLM requests waiting for KV-cache room"),
    ("kv_usage", "sluice_llm_kv_cache_usage_ratio", "gauge", "Fraction of KV-cache blocks in use"),
    ("num_requests", "sluice_llm_requests", "counter", "LLM requests added"),
    ("num_prefix_query_tokens", "sluice_llm_prefix_cache_queried_tokens", "counter",
     "Prompt tokens looked up in the prefix cache"),
    ("num_prefix_hit_tokens", "sluice_llm_prefix_cache_hit_tokens", "counter",
     "Prompt tokens served by the prefix cache"),
    ("num_preemptions", "sluice_llm_preemptions", "counter", "Requests preempted (recomputed later)"),
    ("num_prompt_tokens", "sluice_llm_prompt_tokens", "counter", "Prompt tokens of admitted requests"),
    ("num_output_tokens", "sluice_llm_output_tokens", "counter", "Tokens generated"),
    ("num_draft_tokens", "sluice_llm_draft_tokens", "counter", "Speculative draft tokens verified"),
    ("num_accepted_draft_tokens", "sluice_llm_accepted_draft_tokens", "counter",
     "Speculative draft tokens accepted (each saved one decode step)"),
    # structured output (constrained decoding)
    ("num_structured_requests", "sluice_llm_structured_requests", "counter",
     "LLM requests constrained by structured output"),
    ("num_grammars_compiled", "sluice_llm_grammars_compiled", "counter", "Distinct grammars compiled"),
    ("num_grammar_cache_hits", "sluice_llm_grammar_cache_hits", "counter",
     "Constrained requests whose grammar was already compiled"),
    ("num_grammar_errors", "sluice_llm_grammar_errors", "counter", "Constraints that failed to compile"),
    ("grammar_compile_seconds", "sluice_llm_grammar_compile_seconds", "counter",
     "Seconds spent compiling grammars (off the engine thread)"),
    ("grammar_mask_fill_seconds", "sluice_llm_grammar_mask_fill_seconds", "counter",
     "Engine-thread seconds spent filling token bitmasks"),
    ("num_grammar_mask_steps", "sluice_llm_grammar_mask_steps", "counter",
     "Engine steps that filled token bitmasks"),
)


def model_labels(label: str) -> list[str]:
    """``[name, short digest, engine]`` of a ``sluice.model`` label (all empty when there is none)."""
    try:
        return list(parse_label(label))
    except ValueError:
        return ["", "", ""]


class OperatorCollector(Collector):
    """Turns one runner's stats into metric families at scrape time."""

    def __init__(self, stats: OperatorStats, pipeline: str,
                 engine_stats: Callable[[], Any] | None = None,
                 batching: Callable[[], Any] | None = None,
                 stalls: Callable[[], dict[str, bool]] | None = None) -> None:
        self.stats = stats
        self.stalls = stalls  # part -> stalled now (the progress watchdog), empty before the run
        self.pipeline = pipeline
        self.engine_stats = engine_stats
        self.batching = batching  # the adaptive batcher's latest decision, or None

    def describe(self) -> list[Metric]:
        return []  # families are only known at collect time (LLM fields depend on the engine)

    def collect(self) -> Iterator[Metric]:
        s = self.stats.snapshot()
        labels, values = ["pipeline"], [self.pipeline]
        yield _counter("sluice_records_in", "Records polled from the input topics", labels, values, s.num_in)
        yield _counter("sluice_records_out", "Outputs acknowledged by the broker", labels, values, s.num_out)
        dead = CounterMetricFamily("sluice_records_dead_lettered", "Records sent to the dead-letter topic, "
                                   "by the stage that failed", labels=["pipeline", "stage"])
        for stage, n in sorted(s.num_dead_lettered.items()):
            dead.add_metric([self.pipeline, stage], n)
        yield dead
        yield from self._engine(s.models)
        yield _histogram("sluice_queue_delay_seconds", "Time a record waits between poll and its batch's start",
                         s.queue_delay_s, self.pipeline)
        yield _histogram("sluice_end_to_end_latency_seconds",
                         "From poll to every output of the record acknowledged by the broker",
                         s.latency_s, self.pipeline)
        yield _gauge("sluice_records_in_flight", "Records polled and not yet acknowledged", labels, values,
                     s.num_in_flight)
        lag = GaugeMetricFamily("sluice_consumer_lag_records", "Records behind the partition's end",
                                labels=["pipeline", "topic", "partition"])
        for tp, n in sorted(s.lag.items()):
            lag.add_metric([self.pipeline, tp.topic, str(tp.partition)], n)
        yield lag
        yield _gauge("sluice_assigned_partitions", "Partitions assigned to this process", labels, values,
                     s.num_assigned)
        yield _gauge("sluice_stalled_partitions", "Partitions paused because their next record waits for the "
                     "schema registry (down, slow or refusing the credentials)", labels, values, s.num_stalled)
        yield _counter("sluice_registry_stalls", "Partitions that stalled waiting for the schema registry", labels,
                       values, s.num_stalls)
        yield _counter("sluice_registry_stall_retries", "Retries of stalled records that found the schema registry "
                       "still unavailable", labels, values, s.num_stall_retries)
        if self.stalls is not None:
            parts = self.stalls()
            if parts:
                stalled = GaugeMetricFamily("sluice_progress_stalled", "1 while the part owes work and has made "
                                            "no progress for runtime.stall_timeout_s (/healthz answers 503)",
                                            labels=["pipeline", "part"])
                for part, is_stalled in parts.items():
                    stalled.add_metric([self.pipeline, part.replace(" ", "_")], float(is_stalled))
                yield stalled
        yield from self._reloads(s.models)
        yield from self._adaptive(labels, values)
        yield from self._llm(s.models)

    def _engine(self, m: ModelsSnapshot | None) -> Iterator[Metric]:
        """The engine's numbers, per model (every model served in this run)."""
        labels = ["pipeline", *MODEL_LABELS]
        batches = CounterMetricFamily("sluice_batches", "Batches run through the engine", labels=labels)
        sizes = HistogramMetricFamily("sluice_batch_size_records", "Records per engine batch", labels=labels)
        infer = HistogramMetricFamily("sluice_inference_seconds",
                                      "Engine call per batch (bisection of failures included)", labels=labels)
        warmup = GaugeMetricFamily("sluice_engine_warmup_seconds", "Engine start: model load and warm-up",
                                   labels=labels)
        for label, n in sorted(m.models.items()) if m is not None else ():
            values = [self.pipeline, *model_labels(label)]
            batches.add_metric(values, n.num_batches)
            _add_histogram(sizes, values, n.batch_size)
            _add_histogram(infer, values, n.infer_s)
            warmup.add_metric(values, n.warmup_s)
        yield from (batches, sizes, infer, warmup)

    def _reloads(self, m: ModelsSnapshot | None) -> Iterator[Metric]:
        if m is None or m.serving is None:
            return
        info = GaugeMetricFamily("sluice_model_info", "The model serving now (its name, short and full content "
                                 "digest, engine type)", labels=["pipeline", *MODEL_LABELS, "sha256"])
        info.add_metric([self.pipeline, *model_labels(m.serving.label), m.serving.digest], 1)
        yield info
        reloads = CounterMetricFamily("sluice_model_reloads", "Model reload attempts by result: ready (switched "
                                      "to), unchanged (the model on disk is the serving one), failed",
                                      labels=["pipeline", "result"])
        for result in ("ready", "unchanged", "failed"):
            reloads.add_metric([self.pipeline, result], m.reloads.get(result, 0))
        yield reloads
        failures = CounterMetricFamily("sluice_model_reload_failures", "Failed reloads by stage (memory, read, "
                                       "start, schema, changed); the old model kept serving",
                                       labels=["pipeline", "stage"])
        for stage, n in sorted(m.failures.items()):
            failures.add_metric([self.pipeline, stage], n)
        yield failures
        if m.last_failure is not None:
            f = m.last_failure
            last = GaugeMetricFamily("sluice_model_reload_last_failure_timestamp_seconds", "When the latest "
                                     "reload failed, at which stage (the log says why)",
                                     labels=["pipeline", *MODEL_LABELS, "stage"])
            last.add_metric([self.pipeline, *model_labels(f.model), f.stage], f.at_unix_s)
            yield last

    def _adaptive(self, labels: list[str], values: list[str]) -> Iterator[Metric]:
        decision = self.batching() if self.batching is not None else None
        if decision is None:
            return
        yield _gauge("sluice_adaptive_batch_size_records", "Batch size the adaptive batcher chose last",
                     labels, values, decision.size)
        yield _gauge("sluice_adaptive_predicted_service_seconds", "Engine time it predicted for that batch",
                     labels, values, decision.service_s)

    def _llm(self, m: ModelsSnapshot | None) -> Iterator[Metric]:
        if self.engine_stats is None:
            return
        labels = ["pipeline", *MODEL_LABELS]
        values = [self.pipeline, *model_labels(m.serving.label if m and m.serving else "")]
        try:
            stats = self.engine_stats()
        except Exception as err:  # a scrape must never take the operator down
            log.debug("engine stats unavailable: %s", err)
            return
        for attr, name, kind, doc in _LLM_FIELDS:
            value = getattr(stats, attr, None)
            if value is None:
                continue
            make = _counter if kind == "counter" else _gauge
            yield make(name, doc, labels, values, float(value))


def new_registry(collector: OperatorCollector) -> CollectorRegistry:
    """A private registry holding this runner's collector and the standard process, platform and garbage
    collector metrics (``process_*``: memory, CPU, open files; ``python_*``)."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(standard)
    return registry


def _counter(name: str, doc: str, labels: list[str], values: list[str], value: float) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    family.add_metric(values, value)
    return family


def _gauge(name: str, doc: str, labels: list[str], values: list[str], value: float) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    family.add_metric(values, value)
    return family


def _histogram(name: str, doc: str, h: HistogramSnapshot, pipeline: str) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["pipeline"])
    _add_histogram(family, [pipeline], h)
    return family


def _add_histogram(family: HistogramMetricFamily, values: list[str], h: HistogramSnapshot) -> None:
    family.add_metric(values, h.cumulative(), sum_value=h.total if math.isfinite(h.total) else 0.0)
