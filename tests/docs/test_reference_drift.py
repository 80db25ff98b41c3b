"""The reference pages are generated from the code and cannot drift from it.

docs/tools/generate.py writes the configuration, CLI, metrics and model-family references and the benchmarks
page. Here: every pipeline key has a description (the configuration page shows it), the committed pages are
what the code gives now, and adding a configuration key, a CLI flag or a metric without regenerating them
makes that check fail.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.integration.pipelines import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "tools" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()


def _models() -> Iterator[tuple[str, type[BaseModel]]]:
    """(YAML path, model) of every section of a pipeline file, engine and task options included: the sections
    the configuration reference walks (``generate._sections``)."""
    from sluice.config import Pipeline
    from sluice.engines import engine_types
    from sluice.engines.tasks import task_types as tasks

    roots: list[tuple[str, Any]] = [("", Pipeline)]
    roots += [(f"engine({name})", engine_types.lookup(name).options) for name in engine_types.known_types()]
    roots += [(f"engine.task({name})", tasks.lookup(name).options) for name in tasks.names()]
    for root_path, root in roots:
        yield from generate._sections(root, root_path)


def undescribed(models: Iterator[tuple[str, type[BaseModel]]]) -> list[str]:
    return [f"{path}.{name} ({model.__name__})" for path, model in models
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


def test_every_pipeline_key_has_a_description() -> None:
    missing = undescribed(_models())
    assert not missing, ("these keys have no description for the configuration reference: write a docstring "
                         f"under each field: {missing}")


def test_a_key_added_without_a_description_is_found() -> None:
    from sluice.config.batching import Batching

    class WithANewKnob(Batching):
        new_knob: int = 3

    assert undescribed(iter([("batching", WithANewKnob)])) == ["batching.new_knob (WithANewKnob)"]


def test_the_reference_pages_are_what_the_code_gives() -> None:
    assert generate.stale_pages() == [], "regenerate them: ./dev docs (or python docs/tools/generate.py)"


def test_a_new_configuration_key_makes_the_configuration_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.config import Pipeline
    from sluice.config.batching import Batching

    class WithANewKnob(Batching):
        new_knob: int = Field(default=3, description="A knob nobody documented.")

    monkeypatch.setattr(Pipeline.model_fields["batching"], "annotation", WithANewKnob)
    assert "reference/configuration.md" in generate.stale_pages()


def test_a_new_cli_flag_makes_the_cli_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice import cli

    real = cli._parser

    def with_a_flag() -> argparse.ArgumentParser:
        parser = real()
        parser.add_argument("--new-flag", action="store_true", help="a flag nobody documented")
        return parser

    monkeypatch.setattr(cli, "_parser", with_a_flag)
    assert generate.stale_pages() == ["reference/cli.md"]


def test_a_new_metric_makes_the_metrics_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client.core import GaugeMetricFamily

    from sluice.telemetry.metrics import OperatorCollector

    real = OperatorCollector.collect

    def with_a_metric(self: OperatorCollector) -> Iterator[Any]:
        yield from real(self)
        yield GaugeMetricFamily("sluice_new_thing", "A metric nobody documented", labels=["pipeline"])

    monkeypatch.setattr(OperatorCollector, "collect", with_a_metric)
    assert generate.stale_pages() == ["reference/metrics.md"]


def test_every_benchmark_in_the_catalog_names_its_date_machine_command_and_files() -> None:
    import yaml

    catalog = yaml.safe_load((ROOT / "bench" / "results" / "catalog.yaml").read_text())
    for entry in catalog:
        assert {"name", "script", "measures", "command", "date", "machine", "files", "headline"} <= set(entry), entry
        assert (ROOT / entry["script"]).is_file(), entry["script"]
        assert all((ROOT / "bench" / "results" / name).is_file() for name in entry["files"]), entry["files"]
    scripts = {entry["script"] for entry in catalog}
    results = {Path(p).stem for p in (ROOT / "bench" / "results").glob("*.json")}
    assert {"bench/operator_overhead.py", "bench/llm_peers.py", "bench/compare.py"} <= scripts
    assert results, "bench/results/ holds the raw results the catalog points at"
