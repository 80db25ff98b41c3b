"""Output schemas derived from a result's JSON Schema: each Avro type is checked by writing and reading
values with fastavro, and the same values against the JSON Schema with jsonschema (two independent
libraries agreeing on what the mapping promises)."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import jsonschema
import pytest

from sluice.codecs.result_types import avro_type, merged_avro_record, merged_json_schema

LABELS = {"type": "object", "properties": {"label": {"type": "string", "enum": ["pos", "neg"]},
                                           "score": {"type": "number"},
                                           "spans": {"type": "array", "items": {
                                               "type": "object", "properties": {"start": {"type": "integer"},
                                                                               "end": {"type": "integer"}},
                                               "required": ["start", "end"]}}},
          "required": ["label", "score"]}


def _round_trip(avro: Any, value: Any) -> Any:
    schema = fastavro.parse_schema({"type": "record", "name": "Out", "fields": [{"name": "r", "type": avro}]})
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, {"r": value})
    buffer.seek(0)
    return fastavro.schemaless_reader(buffer, schema)["r"]


@pytest.mark.parametrize("json_schema, value", [
    ({"type": "array", "items": {"type": "number", "format": "float"}}, [0.5, -2.0, 3.25]),
    ({"type": "array", "items": {"type": "number"}}, [0.1, 1e300]),
    ({"type": "string"}, "a label"),
    ({"type": ["string", "null"]}, None),
    ({"type": "integer"}, 2**40),
    ({"type": "object", "additionalProperties": {"type": "number"}}, {"pos": 0.9, "neg": 0.1}),
    (LABELS, {"label": "pos", "score": 0.75, "spans": [{"start": 0, "end": 4}]}),
    (LABELS, {"label": "neg", "score": 0.25}),  # optional property left out: null by default
])
def test_values_of_the_json_schema_round_trip_through_the_avro_type(json_schema: dict[str, Any], value: Any) -> None:
    jsonschema.validate(value, json_schema)
    got = _round_trip(avro_type(json_schema, name="result"), value)
    if isinstance(value, dict) and "properties" in json_schema:
        value = {k: value.get(k) for k in json_schema["properties"]}
    assert got == value


def test_float_format_is_32_bit_and_anything_unmappable_names_its_path() -> None:
    assert avro_type({"type": "array", "items": {"type": "number", "format": "float"}}, "r") == {
        "type": "array", "items": "float"}
    with pytest.raises(ValueError, match=r"result.properties.x: an array needs one 'items'"):
        avro_type({"type": "object", "properties": {"x": {"type": "array"}}}, "r")
    with pytest.raises(ValueError, match="not a valid Avro field name"):
        avro_type({"type": "object", "properties": {"a-b": {"type": "string"}}}, "r")


REVIEW = {"type": "record", "name": "Review", "namespace": "shop",
          "fields": [{"name": "id", "type": "long"}, {"name": "text", "type": "string"}]}


def test_merged_avro_record_is_the_input_plus_the_result_field_and_reads_old_records() -> None:
    merged = merged_avro_record(REVIEW, "labels", avro_type(LABELS, name="labels"))
    assert [f["name"] for f in merged["fields"]] == ["id", "text", "labels"]
    assert merged["fields"][2]["type"]["name"] == "Review_labels"  # cannot collide with the input's types
    assert (merged["name"], merged["namespace"]) == ("Review", "shop") and REVIEW["fields"] == merged["fields"][:2]
    fastavro.parse_schema(merged)
    with pytest.raises(ValueError, match="already has a field 'text'"):
        merged_avro_record(REVIEW, "text", "string")
    with pytest.raises(ValueError, match="not an Avro record"):
        merged_avro_record("string", "r", "string")


def test_merged_json_schema_adds_an_optional_property() -> None:
    review = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
              "additionalProperties": False}
    merged = merged_json_schema(review, "embedding", {"type": "array", "items": {"type": "number"}})
    jsonschema.validate({"text": "a", "embedding": [1.0]}, merged)
    jsonschema.validate({"text": "a"}, merged)  # what the input schema allowed still validates
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"text": "a", "embedding": "no"}, merged)
    assert review["properties"] == {"text": {"type": "string"}}  # the input schema is not changed
