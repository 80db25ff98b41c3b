"""The llm engine's pipeline options against the standalone engine's: one set of defaults and allowed values
(``EngineConfig``'s), checked when the pipeline is loaded, and a model path relative to the pipeline file."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from sluice.config import ConfigError, parse_pipeline
from sluice.engines.llm import EngineConfig
from sluice.engines.llm.operator_options import ENGINE_SETTINGS, LLMOptions

PIPELINE = """\
source: {kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [in], group_id: g}}
engine: {type: llm, model: models/tiny%s}
sink: {kafka: {topic: out}}
"""
# Fields both models have that mean different things: seed seeds each record's sampling here, and in
# EngineConfig the requests that have no seed of their own.
DIFFERENT_MEANING = {"seed"}


def engine_defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def test_every_engine_setting_of_the_pipeline_has_the_engines_default() -> None:
    engine = engine_defaults()
    pipeline = {name: field.default for name, field in LLMOptions.model_fields.items()}
    assert len(ENGINE_SETTINGS) >= 10
    for name in ENGINE_SETTINGS:
        assert name in engine and name in pipeline, name
        assert pipeline[name] == engine[name], f"{name}: LLMOptions {pipeline[name]!r}, EngineConfig {engine[name]!r}"
    # a field added to both under one name is either an engine setting or listed as meaning something else
    # (kernels: a section of its own, converted to the engine's KernelOptions)
    assert set(engine) & set(pipeline) == set(ENGINE_SETTINGS) | DIFFERENT_MEANING | {"kernels"}
    assert LLMOptions().kernels.options() == EngineConfig().kernels


def test_the_options_pass_every_engine_setting_to_the_engine() -> None:
    assert EngineConfig(**LLMOptions().engine_settings()) == EngineConfig()
    given = LLMOptions(max_num_seqs=5, max_num_batched_tokens=96, dtype="bfloat16", weights="int8", device="cpu",
                       num_speculative_tokens=2, kv_cache_memory_mb=3)
    config = EngineConfig(**given.engine_settings())
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.dtype, config.weights, config.device,
            config.num_speculative_tokens) == (5, 96, "bfloat16", "int8", "cpu", 2)
    assert config.kv_cache_memory_bytes == 3 * 1024 * 1024


@pytest.mark.parametrize(("option", "value"), [("dtype", "fp8"), ("weights", "int5")])
def test_a_value_the_engine_refuses_fails_validation_at_its_yaml_path(option: str, value: str) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**{option: value})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        LLMOptions(**{option: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        parse_pipeline(PIPELINE % f", {option}: {value}", environ={})
    assert f"engine.{option} (line 2)" in str(info.value)


def test_a_relative_model_path_is_found_beside_the_pipeline_file(
    tiny_llama_dir: Callable[[bool], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.engines.engine_contract import EngineContext, EngineStartError
    from sluice.engines.llm import SamplingParams
    from sluice.engines.llm.operator_engine import LLMEngine, Prompt

    pipeline_dir = tmp_path / "pipelines"
    (pipeline_dir / "models").mkdir(parents=True)
    (pipeline_dir / "models" / "tiny").symlink_to(tiny_llama_dir(False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory has no models/tiny
    loaded = parse_pipeline(PIPELINE % ", kv_cache_memory_mb: 4, max_tokens: 3", environ={}, base_dir=pipeline_dir)
    engine = LLMEngine(loaded.engine_options, EngineContext(max_batch_size=4, pipeline_dir=str(loaded.base_dir)))
    assert engine.model_source().path == pipeline_dir / "models" / "tiny"
    engine.start()
    try:
        engine.add(0, Prompt([5, 6, 7], SamplingParams(max_tokens=3)))
        results: dict[int, object] = {}
        while engine.llm.has_unfinished():
            results.update(engine.step())
        assert list(results) == [0] and isinstance(results[0], str)
    finally:
        engine.close()
    lost = LLMEngine(loaded.engine_options, EngineContext(max_batch_size=4))  # resolved against the cwd
    assert lost.model_source().path is None
    with pytest.raises(EngineStartError, match="models/tiny"):
        lost.start()
