"""The schema-registry parts of a pipeline file: errors name the YAML path and what to write instead."""

from __future__ import annotations

import pytest

from sluice.config import ConfigError, parse_pipeline

BASE = """
source: {kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [reviews], group_id: g}}
engine: {type: python, function: "examples.functions.text:noop"}
"""


def _parse(codec: str, output: str = "{}") -> object:
    return parse_pipeline(BASE + f"codec: {codec}\nsink: {{kafka: {{topic: out}}, output: {output}}}\n")


@pytest.mark.parametrize("codec, output, message", [
    ("{format: avro}", "{}", "format avro needs schema_registry"),
    ("{format: protobuf, schema_registry: {url: 'http://r:8081'}}", "{}", "needs message_type"),
    ("{format: avro, schema_registry: {url: 'r:8081'}}", "{}", "expected http://host:port"),
    ("{format: json, message_type: 'a:B'}", "{}", "message_type is for format protobuf only"),
    ("{format: json}", "{format: avro}", "sink.output.format avro needs codec.format avro"),
    ("{format: avro, schema_registry: {url: 'http://r:8081'}}", "{format: protobuf}", "needs codec.format protobuf"),
    ("{format: protobuf, schema_registry: {url: 'http://r:8081'}, message_type: 'a:B'}", "{}",
     "needs sink.output.message_type"),
    ("{format: avro, schema_registry: {url: 'http://r:8081'}}", "{schema_file: x.avsc, format: json}",
     "schema_file is for the avro and json_schema output formats"),
    ("{format: avro, schema_registry: {url: 'http://r:8081', retries: 3}}", "{}", "unknown key 'retries'"),
])
def test_mistakes_are_reported_with_what_to_write(codec: str, output: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(codec, output)


def test_the_output_format_defaults_to_the_inputs() -> None:
    loaded = _parse("{format: avro, schema_registry: {url: 'http://r:8081'}}")
    assert loaded.pipeline.output_format() == "avro"  # type: ignore[attr-defined]
    assert _parse("{format: raw}").pipeline.output_format() == "json"  # type: ignore[attr-defined]
    loaded = _parse("{format: avro, schema_registry: {url: 'http://r:8081'}}", "{format: json}")
    assert loaded.pipeline.output_format() == "json"  # type: ignore[attr-defined]


def test_a_registry_password_never_appears_in_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        _parse("{format: avro, schema_registry: {url: 'http://r:8081', basic_auth: {username: u, "
               "password: [hunter2]}}}")
    assert "hunter2" not in str(err.value) and "basic_auth.password" in str(err.value)
