"""Checks over a Prometheus scrape: the naming conventions Sluice follows, and the Grafana dashboard's queries.

* names: ``sluice_`` (or the client's ``process_`` / ``python_``), snake case, base units -- no ``ms``,
  ``percent``, ``per_second`` or other precomputed rates; counters exposed as ``_total``;
* labels: from a known set, never free text (no spaces or parentheses in a value, short), the model as
  ``model`` / ``digest`` / ``engine``.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "sluice-dashboard.json"

_NAME = re.compile(r"^(sluice|process|python)_[a-z0-9_]+$")
_NOT_BASE_UNITS = {"ms", "milliseconds", "us", "microseconds", "minutes", "hours", "percent", "per", "rate",
                   "kb", "mb", "gb", "kib", "mib"}
_LABELS = {"pipeline", "model", "digest", "engine", "sha256", "stage", "result", "topic", "partition", "part",
           "le", "generation", "implementation", "major", "minor", "patchlevel", "version"}
_VALUE = re.compile(r"^[^\s()]{0,100}$")
_METRIC_IN_QUERY = re.compile(r"\b(?:sluice|process|python)_[a-z0-9_]+\b")


def families(body: str) -> list[Metric]:
    return list(text_string_to_metric_families(body))


def lint(scraped: list[Metric]) -> list[str]:
    """What breaks the conventions, one line each (empty: nothing)."""
    problems = []
    for family in scraped:
        name = family.name
        if not _NAME.match(name):
            problems.append(f"{name}: not a snake-case sluice_/process_/python_ name")
        bad_units = _NOT_BASE_UNITS & set(name.split("_"))
        if bad_units:
            problems.append(f"{name}: {sorted(bad_units)} -- use base units and counters (rate() is the query's)")
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith(("_total", "_created")):
                problems.append(f"{sample.name}: a counter sample without _total")
            for label, value in sample.labels.items():
                if label not in _LABELS:
                    problems.append(f"{sample.name}: unexpected label {label!r}")
                if name.startswith("sluice_") and not _VALUE.match(value):
                    problems.append(f"{sample.name}: label {label}={value!r} is free text")
                if label == "digest" and value and not re.fullmatch(r"[0-9a-f]{12}", value):
                    problems.append(f"{sample.name}: digest {value!r} is not 12 hex digits")
    return problems


def exposed(scraped: list[Metric]) -> set[str]:
    """Every sample name a query can use (``x_total``, ``x_bucket``, ...)."""
    return {sample.name for family in scraped for sample in family.samples}


def dashboard_metrics(path: Path = DASHBOARD) -> dict[str, set[str]]:
    """Metric names per panel title, from every query of the dashboard."""
    out: dict[str, set[str]] = {}
    for panel in json.loads(path.read_text())["panels"]:
        for target in panel.get("targets", []):
            out.setdefault(panel["title"], set()).update(_METRIC_IN_QUERY.findall(target["expr"]))
    return out


def every_part_scrape() -> list[Metric]:
    """A scrape of the collector with every optional part present (an LLM engine, adaptive batching, a
    failed reload, the watchdog), as the metrics reference is generated."""
    from sluice.engines.identity import ModelIdentity
    from sluice.engines.llm.operator_engine import LLMStats
    from sluice.operator.record import TopicPartition
    from sluice.operator.reload.outcome import ReloadOutcome
    from sluice.telemetry.metrics import OperatorCollector, new_registry
    from sluice.telemetry.stats import OperatorStats

    stats = OperatorStats()
    stats.record_rejected(["decode"])
    stats.record_tick(0, {TopicPartition("in", 0): 5})
    model = ModelIdentity("smollm2-135m (q4)", "d" * 64, "llm")  # a name with spaces: the label must not
    stats.models.record_serving(model, 1.0)
    stats.models.record_reload(ReloadOutcome("failed", model, 1.0, "start", "a reason (with spaces)"))
    decision = types.SimpleNamespace(size=1, service_s=0.01, rate_per_s=1.0)
    collector = OperatorCollector(stats, "pipeline", engine_stats=lambda: LLMStats(0, 0, 0.0, 0.0, 0, 0, 0),
                                  batching=lambda: decision, stalls=lambda: {"poll loop": False, "engine": True})
    return families(generate_latest(new_registry(collector)).decode())
