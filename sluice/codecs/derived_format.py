"""Schema Registry formats whose records are dicts and whose output schema is derived from the input's
(avro, json_schema): the output schema is the input's record schema plus the result field, registered
under the output subject once per input schema id, unless ``sink.output.schema_file`` gives it.

A format module (``avro.py``, ``json_schema.py``) says how to derive and name the output schema and which
serializer writes it; the framing, the per-schema-id writers and the failure handling are
:class:`~sluice.codecs.schema_format.SchemaFormat`'s.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from pathlib import Path
from typing import Any

from sluice.codecs.output_shape import OutputShape
from sluice.codecs.schema_format import OutputWriter, SchemaFormat, SchemaSetupError
from sluice.codecs.schema_registry import RegistryUnavailable, SchemaRejected, registry_call


class DictWriter:
    """Output records of one output schema, for formats whose records are dicts (avro, json_schema): the
    serializer and its context are made once."""

    __slots__ = ("serialize", "ctx", "shape")

    def __init__(self, serializer: Any, ctx: Any, shape: OutputShape) -> None:
        self.serialize, self.ctx, self.shape = serializer, ctx, shape

    def write(self, record: Any, result: Any) -> bytes:
        value: bytes = self.serialize(self.shape.document(record, result), self.ctx)
        return value


class DerivedSchemaFormat(SchemaFormat):
    """Formats whose records are dicts and whose output schema is derived from the input's (avro,
    json_schema), unless ``sink.output.schema_file`` gives it."""

    _given: OutputWriter | None = None  # from sink.output.schema_file

    @abstractmethod
    def derive(self, input_schema: Any, result_schema: dict[str, Any]) -> dict[str, Any]:
        """The output schema for records of ``input_schema`` (parsed JSON). Raises ValueError."""

    @abstractmethod
    def record_name(self, out_schema: dict[str, Any]) -> str | None:
        """The name the record and topic_record subject strategies use for ``out_schema``."""

    @abstractmethod
    def serializer(self, schema: Any) -> Any:
        """confluent-kafka's serializer for the registry Schema ``schema`` (registered already)."""

    def field(self, record: Any, path: tuple[str, ...]) -> Any:
        return dict_field(record, path)

    def start(self, input_topics: list[str]) -> None:
        if self.output.schema_file is not None and not self.writes_json:
            text = read_schema_file(self.base_dir, self.output.schema_file)
            try:
                self._given = self._register(json.loads(text), [])
            except (ValueError, RegistryUnavailable, SchemaRejected) as err:
                raise SchemaSetupError(f"sink.output.schema_file {self.output.schema_file}: {err}") from None
        super().start(input_topics)

    def writer_for(self, schema: Any) -> OutputWriter | None:
        if self.writes_json:
            return None
        if self._given is not None:
            return self._given
        if self.result_schema is None:
            raise ValueError("the engine does not say what its results look like, so the output schema cannot be "
                             "derived: give sink.output.schema_file (or, for the python engine, "
                             "engine.result_schema)")
        return self._register(self.derive(json.loads(schema.schema_str), self.result_schema), schema.references)

    def _register(self, out_schema: dict[str, Any], references: Any) -> OutputWriter:
        """Register ``out_schema`` under the output subject (the registry checks its compatibility there), then
        make the serializer, whose first call finds the id in the client's cache instead of asking again."""
        from confluent_kafka.schema_registry import Schema

        sr_schema = Schema(json.dumps(out_schema), self.schema_type, references or [])
        subject = self.out.subject(self.record_name(out_schema))
        registry_call(lambda: self.client.register_schema(subject, sr_schema),
                      f"registering the output schema under subject {subject}")
        try:
            serializer = self.serializer(sr_schema)
        except Exception as err:  # fastavro's SchemaParseException, jsonschema's SchemaError...
            raise ValueError(f"the output schema does not parse: {err}") from None
        return DictWriter(serializer, self.out.context(), OutputShape.of(self.output))


def dict_field(record: Any, path: tuple[str, ...]) -> Any:
    """A dotted path into nested dicts; a missing or null part raises KeyError."""
    value = record
    for part in path:
        if not isinstance(value, dict):
            raise KeyError(part)
        value = value.get(part)
        if value is None:
            raise KeyError(part)
    return value


def read_schema_file(base_dir: Path, name: str) -> str:
    """The text of ``sink.output.schema_file`` (relative to the pipeline file). Raises SchemaSetupError."""
    path = Path(name) if Path(name).is_absolute() else base_dir / name
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SchemaSetupError(f"sink.output.schema_file: cannot read {path}: {err}") from None
