"""Options that do not apply to the chosen engine or delivery mode: an error where ignoring them would break
what was asked for, a warning where they merely do nothing -- each naming the YAML path and line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.config import ConfigError, parse_pipeline

BASE = """\
source: {kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [in], group_id: g}}
engine: {type: python, function: "examples.functions.text:shout"}
sink: {kafka: {topic: out}}
"""
LLM = BASE.replace('{type: python, function: "examples.functions.text:shout"}', "{type: llm, model: m.gguf}")


def problems(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, environ={})
    return str(info.value)


def test_an_exactly_once_section_without_exactly_once_delivery_is_an_error() -> None:
    message = problems(BASE + "exactly_once: {transaction_interval_ms: 200}\n")
    assert "exactly_once (line 4)" in message and "delivery: exactly_once" in message
    loaded = parse_pipeline(BASE + "delivery: exactly_once\nexactly_once: {transaction_interval_ms: 200}\n", environ={})
    assert loaded.pipeline.exactly_once.transaction_interval_ms == 200 and loaded.warnings == ()


def test_batching_for_the_llm_engine_warns_per_key_and_a_latency_target_is_an_error() -> None:
    loaded = parse_pipeline(LLM + "batching:\n  max_queue_delay_ms: 50\n  max_batch_size: 8\n", environ={})
    assert len(loaded.warnings) == 2
    delay, size = loaded.warnings
    assert delay.startswith("batching.max_queue_delay_ms (line 5)") and "does not apply" in delay
    assert size.startswith("batching.max_batch_size (line 6)") and "engine.max_num_seqs" in size
    assert parse_pipeline(LLM, environ={}).warnings == ()  # defaults are not the user's choice
    assert parse_pipeline(LLM + "batching: {max_batch_size: 32, latency_target_ms: null}\n", environ={}).warnings == ()
    message = problems(LLM + "batching: {latency_target_ms: 200}\n")
    assert "batching.latency_target_ms" in message and "does not apply to engine llm" in message


def test_a_dumped_and_reloaded_pipeline_is_as_valid_as_the_original() -> None:
    for text in (BASE, LLM, BASE + "delivery: exactly_once\nexactly_once: {transaction_interval_ms: 200}\n"):
        loaded = parse_pipeline(text, environ={})
        again = parse_pipeline(json.dumps(loaded.pipeline.model_dump(mode="json")), environ={})
        assert again.pipeline == loaded.pipeline and again.warnings == loaded.warnings == ()


def test_batching_for_a_batch_engine_is_quiet_and_preserve_order_there_warns() -> None:
    assert parse_pipeline(BASE + "batching: {max_queue_delay_ms: 50, latency_target_ms: 100}\n",
                          environ={}).warnings == ()
    loaded = parse_pipeline(BASE.replace("{topic: out}}", "{topic: out}, output: {preserve_order: true}}"),
                            environ={})
    assert len(loaded.warnings) == 1 and "continuous engines (llm) only" in loaded.warnings[0]


@pytest.mark.parametrize("device", ["gpu", "cuda0", "tpu", "CPU"])
def test_a_device_no_engine_knows_fails_validation_not_the_start(device: str) -> None:
    message = problems(LLM.replace("model: m.gguf", f"model: m.gguf, device: {device}"))
    assert "engine.device (line 2)" in message and "auto, cpu, cuda or cuda:N" in message
    for good in ("auto", "cpu", "cuda", "cuda:1"):
        parse_pipeline(LLM.replace("model: m.gguf", f"model: m.gguf, device: '{good}'"), environ={})


def test_validate_prints_the_warnings_and_still_accepts_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(LLM + "batching: {max_queue_delay_ms: 50}\n")
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"{path}: warning: batching.max_queue_delay_ms (line 4)" in proc.stderr and ": ok (" in proc.stdout
