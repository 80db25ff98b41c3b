"""Output schemas derived from an input schema and the engine's result: pure functions, no registry.

An engine describes its result with a JSON Schema (``engine.result_schema()``: a float array for an
embedding, an object for labels, a string or the structured-output schema for an LLM). For Avro outputs
:func:`avro_type` turns that into an Avro type; :func:`merged_avro_record` / :func:`merged_json_schema` add
it to the input's record schema as one more field. Everything the mapping cannot express raises
:class:`ValueError` with the JSON Schema path, so the pipeline fails at start, not per record.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PRIMITIVES = {"string": "string", "integer": "long", "boolean": "boolean", "null": "null"}
_FLOAT_FORMATS = ("float", "float32")  # 32-bit values: Avro float, half the bytes of double


def avro_type(schema: Mapping[str, Any], name: str, path: str = "result") -> Any:
    """The Avro type of values that validate against the JSON Schema ``schema``.

    ``name``: the Avro name given to a record made for an object (nested ones append ``_<property>``).
    Objects with ``properties`` become records (properties not ``required`` become optional: null by
    default), objects with only ``additionalProperties`` become maps, string enums become strings (a new
    label never breaks compatibility), type lists and ``anyOf`` / ``oneOf`` become unions.
    """
    if not isinstance(schema, Mapping):
        raise ValueError(f"{path}: expected a JSON Schema object, got {schema!r}")
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches is not None:
        return _union([avro_type(b, f"{name}_{i}", f"{path}.anyOf[{i}]") for i, b in enumerate(branches)])
    kind = schema.get("type")
    if kind is None and "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        kind = "string"
    if isinstance(kind, list):
        return _union([avro_type({**schema, "type": k}, name, path) for k in kind])
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "number":
        return "float" if schema.get("format") in _FLOAT_FORMATS else "double"
    if kind == "array":
        items = schema.get("items")
        if not isinstance(items, Mapping):
            raise ValueError(f"{path}: an array needs one 'items' schema to map to Avro")
        return {"type": "array", "items": avro_type(items, f"{name}_item", f"{path}.items")}
    if kind == "object":
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            required = set(schema.get("required", ()))
            fields = []
            for key, sub in properties.items():
                if not _AVRO_NAME.match(key):
                    raise ValueError(f"{path}.properties: {key!r} is not a valid Avro field name")
                field_type = avro_type(sub, f"{name}_{key}", f"{path}.properties.{key}")
                if key in required:
                    fields.append({"name": key, "type": field_type})
                else:
                    fields.append({"name": key, "type": _union(["null", field_type]), "default": None})
            return {"type": "record", "name": name, "fields": fields}
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return {"type": "map", "values": avro_type(values, f"{name}_value", f"{path}.additionalProperties")}
        raise ValueError(f"{path}: an object needs 'properties' (or an 'additionalProperties' schema) to map to Avro")
    raise ValueError(f"{path}: JSON Schema {dict(schema)!r} has no Avro equivalent here; "
                     "give the output schema in sink.output.schema_file")


def _union(types: list[Any]) -> Any:
    flat: list[Any] = []
    for t in types:
        for member in t if isinstance(t, list) else [t]:
            if member not in flat:
                flat.append(member)
    if "null" in flat:  # null first: an optional field's default (null) must match the first branch
        flat.remove("null")
        flat.insert(0, "null")
    return flat[0] if len(flat) == 1 else flat


def merged_avro_record(input_schema: Any, field: str, result_type: Any) -> dict[str, Any]:
    """The input's Avro record schema plus ``field`` of ``result_type`` (last, so every input field keeps
    its position). Same name and namespace as the input: it is that record, enriched."""
    if not isinstance(input_schema, Mapping) or input_schema.get("type") != "record":
        raise ValueError("the input schema is not an Avro record, so there is nothing to add a result field to "
                         "(write sink.output.mode: result, or give sink.output.schema_file)")
    if not _AVRO_NAME.match(field):
        raise ValueError(f"sink.output.field {field!r} is not a valid Avro field name")
    if any(f.get("name") == field for f in input_schema.get("fields", ())):
        raise ValueError(f"the input schema already has a field {field!r}; choose another sink.output.field")
    merged = copy.deepcopy(dict(input_schema))
    merged["fields"] = [*merged.get("fields", ()), {"name": field, "type": _namespaced(result_type, merged)}]
    return merged


def result_avro_record(name: str, namespace: str | None, field: str, result_type: Any) -> dict[str, Any]:
    """``sink.output.mode: result``: a record holding the result field only."""
    record: dict[str, Any] = {"type": "record", "name": name, "fields": [{"name": field, "type": result_type}]}
    if namespace:
        record["namespace"] = namespace
    return record


def _namespaced(result_type: Any, record: Mapping[str, Any]) -> Any:
    """Nested result records are named after the enclosing record (``Review_result``) so that they cannot
    collide with a type the input already defines."""
    if isinstance(result_type, dict) and result_type.get("type") == "record":
        return _renamed(result_type, str(record.get("name", "Record")))
    return result_type


def _renamed(node: Any, prefix: str) -> Any:
    if isinstance(node, list):
        return [_renamed(n, prefix) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if out.get("type") == "record":
        out["name"] = f"{prefix}_{out['name']}"
        out["fields"] = [{**f, "type": _renamed(f["type"], prefix)} for f in out["fields"]]
    elif out.get("type") == "array":
        out["items"] = _renamed(out["items"], prefix)
    elif out.get("type") == "map":
        out["values"] = _renamed(out["values"], prefix)
    return out


def merged_json_schema(input_schema: Any, field: str, result_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The input's JSON Schema (an object schema) with ``field`` added to its properties. Not added to
    ``required``: a reader of the input schema's versions reads the outputs too."""
    if not isinstance(input_schema, Mapping) or input_schema.get("type") != "object":
        raise ValueError("the input JSON Schema does not describe an object, so there is nothing to add a result "
                         "field to (write sink.output.mode: result, or give sink.output.schema_file)")
    properties = input_schema.get("properties", {})
    if field in properties:
        raise ValueError(f"the input schema already has a property {field!r}; choose another sink.output.field")
    merged = copy.deepcopy(dict(input_schema))
    merged["properties"] = {**properties, field: dict(result_schema)}
    return merged


def result_json_schema(title: str, field: str, result_schema: Mapping[str, Any]) -> dict[str, Any]:
    """``sink.output.mode: result``: an object schema holding the result field only."""
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": title, "type": "object",
            "properties": {field: dict(result_schema)}, "required": [field]}
