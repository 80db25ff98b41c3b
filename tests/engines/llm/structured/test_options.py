"""``engine.structured_output`` in a pipeline: ``sluice validate`` names the YAML path of every bad constraint;
records carrying their own constraint; the results and dead letters a user sees (with SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.config import ConfigError, load_pipeline, parse_pipeline
from sluice.engines.engine_contract import EngineContext, RecordError
from sluice.engines.llm.operator_engine import AnswerError, LLMEngine, LLMOptions

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["positive", "negative"]}}, "required": ["label"],
          "additionalProperties": False}


def pipeline(engine: dict[str, Any]) -> str:
    doc = {
        "source": {"kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["in"], "group_id": "g"}},
        "codec": {"format": "json", "input_field": "."},
        "engine": {"type": "llm", "model": "smollm2-135m", **engine},
        "sink": {"kafka": {"topic": "out"}},
        "dead_letter": {"topic": "dlq"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize(
    ("structured", "where", "message"),
    [
        ({"regex": "[a-z]+("}, "engine.structured_output.regex (line 14)", "unclosed group"),
        ({"json_schema": {"type": "object", "properties": {"n": {"minimum": "five"}}}},
         "engine.structured_output.json_schema (line 14)", "not a valid JSON Schema at properties/n/minimum"),
        ({"json_schema": {"type": "objekt"}}, "engine.structured_output.json_schema (line 14)", "objekt"),
        ({"choice": []}, "engine.structured_output.choice (line 14)", "at least one string"),
        ({"regex": "a", "choice": ["a"]}, "engine.structured_output (line 13)", "exactly one of"),
        ({}, "engine.structured_output (line 13)", "got none"),
        ({"json_schema_file": "missing.json"}, "engine.structured_output.json_schema_file (line 14)",
         "cannot read the schema file"),
        ({"regex": "a", "backend": "outlines"}, "engine.structured_output.backend (line 15)", "llguidance"),
    ],
)
def test_validate_names_the_yaml_path_of_a_bad_constraint(structured: dict[str, Any], where: str,
                                                          message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(pipeline({"structured_output": structured}), environ={})
    text = str(info.value)
    assert where in text and message in text, text


def test_conflicting_options_are_validation_errors() -> None:
    with pytest.raises(ConfigError, match="ignore_eos cannot be combined with structured_output"):
        parse_pipeline(pipeline({"structured_output": {"choice": ["a"]}, "ignore_eos": True}), environ={})
    with pytest.raises(ConfigError, match="give the schema once"):
        parse_pipeline(pipeline({"structured_output": {"json_schema": SCHEMA}, "json_schema": SCHEMA}), environ={})


def test_schema_file_is_read_relative_to_the_pipeline_and_json_is_the_default_parse(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "label.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "p.yaml").write_text(pipeline({"structured_output": {"json_schema_file": "schemas/label.json"}}))
    options = load_pipeline(tmp_path / "p.yaml", environ={}).engine_options
    assert options.parse_mode == "json"
    assert options.structured_output.spec().schema() == SCHEMA
    (tmp_path / "schemas" / "label.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"json_schema_file \(line 14\): .*is not valid JSON"):
        load_pipeline(tmp_path / "p.yaml", environ={})
    assert LLMOptions(structured_output={"choice": ["a"]}).parse_mode == "none"  # type: ignore[arg-type]
    assert LLMOptions(overrides={"json_schema": "schema"}).parse_mode == "json"
    assert LLMOptions(structured_output={"json_schema": SCHEMA}, parse="none").parse_mode == "none"  # type: ignore[arg-type]


# ---- the engine behind the operator, with SmolLM2 ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine(smollm2_gguf: Path) -> Any:
    options = LLMOptions(
        model=str(smollm2_gguf), max_model_len=384, kv_cache_memory_mb=48, max_tokens=40,
        system_prompt="Label the sentiment of the review. Answer with JSON.", user_template="Review: {text}",
        structured_output={"json_schema": SCHEMA},  # type: ignore[arg-type]
        overrides={"choice": "labels", "json_schema": "schema", "max_tokens": "max_len"},
    )  # fmt: skip
    llm_engine = LLMEngine(options, EngineContext(max_batch_size=8))
    llm_engine.start()
    yield llm_engine
    llm_engine.close()


def run(engine: Any, records: list[dict[str, Any]]) -> list[Any]:
    items = [engine.prepare([r])[0] for r in records]
    for key, item in enumerate(items):
        engine.add(key, item)
    results: dict[int, Any] = {}
    while engine.llm.has_unfinished():
        results.update(engine.step())
    return [results[k] for k in range(len(items))]


@pytest.mark.slow
def test_results_are_json_objects_and_records_may_carry_their_own_constraint(engine: Any) -> None:
    own = {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
           "required": ["stars"], "additionalProperties": False}
    pipeline_schema, record_schema, labels, cut = run(engine, [
        {"text": "I love it, it works perfectly."},
        {"text": "Two stars at most, it broke.", "schema": own},
        {"text": "Meh.", "labels": ["good", "bad"]},
        {"text": "Fine.", "schema": {"type": "object", "properties": {"note": {"type": "string"}},
                                     "required": ["note"]}, "max_len": 3},
    ])  # fmt: skip
    assert pipeline_schema in ({"label": "positive"}, {"label": "negative"})
    assert isinstance(record_schema, dict) and set(record_schema) == {"stars"} and 1 <= record_schema["stars"] <= 5
    assert labels in ("good", "bad")  # a record's choice answer stays text (parse defaults to json for schemas)
    assert isinstance(cut, AnswerError) and "reached max_tokens (3) before its json_schema was complete" in str(cut)
    stats = engine.stats
    assert stats.num_structured_requests == stats.num_requests and stats.num_grammars_compiled == 4
    assert stats.grammar_mask_fill_seconds > 0 and stats.num_grammar_mask_steps > 0


def test_a_record_with_an_unusable_constraint_is_its_own_error(engine: Any) -> None:
    with pytest.raises(RecordError, match="the record's json_schema .field 'schema'. cannot constrain the answer: "
                                          "not a valid JSON Schema"):
        engine.prepare([{"text": "x", "schema": {"type": 5}}])
    with pytest.raises(RecordError, match="record's choice .field 'labels'.*list of strings"):
        engine.prepare([{"text": "x", "labels": "good"}])


@pytest.mark.slow
def test_structured_output_numbers_reach_the_metrics_endpoint(engine: Any) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sluice.telemetry.metrics import OperatorCollector, new_registry
    from sluice.telemetry.stats import OperatorStats

    run(engine, [{"text": "Great!"}, {"text": "Bad.", "labels": ["good", "bad"]}])
    body = generate_latest(new_registry(OperatorCollector(OperatorStats(), "p", lambda: engine.stats))).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples["sluice_llm_structured_requests_total"] == samples["sluice_llm_requests_total"] >= 2
    assert samples["sluice_llm_grammars_compiled_total"] >= 2 and samples["sluice_llm_grammar_cache_hits_total"] >= 0
    assert samples["sluice_llm_grammar_compile_seconds_total"] > 0
    assert samples["sluice_llm_grammar_mask_fill_seconds_total"] > 0 and samples["sluice_llm_grammar_mask_steps_total"] > 0


def test_a_grammar_that_fails_in_the_engine_is_that_records_error(engine: Any) -> None:
    from sluice.engines.llm import SamplingParams, StructuredOutput
    from sluice.engines.llm.operator_engine import Prompt

    good = engine.prepare([{"text": "Lovely.", "labels": ["yes", "no"]}])[0]
    bad = Prompt(good.token_ids, SamplingParams(structured_output=StructuredOutput(regex="[a-z")))  # unchecked
    engine.add(0, bad)
    engine.add(1, good)
    results: dict[int, Any] = {}
    while engine.llm.has_unfinished():
        results.update(engine.step())
    assert isinstance(results[0], RecordError) and not isinstance(results[0], AnswerError)
    assert "structured output: the regex cannot be used" in str(results[0])
    assert results[1] in ("yes", "no")
