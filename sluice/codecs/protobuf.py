"""``codec.format: protobuf``: Protobuf messages with Schema Registry framing (message indexes included),
read and written by confluent-kafka's ProtobufDeserializer and ProtobufSerializer with the generated message
classes the pipeline names (``codec.message_type``, ``sink.output.message_type``).

Merge mode parses each input message's bytes into the output type, so the output message must hold the
input's fields under the same numbers (checked at start) plus the result field.

The deserializer is given no registry client on purpose: with one it fetches each writer schema as a
serialized descriptor, which Apicurio's Confluent-compatible API returns unencoded (unreadable to the
client). The message class decides how the bytes read, as it does in any consumer of generated classes;
schema ids are still checked against the registry once each (``SchemaFormat._writer_of``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.codecs.schema_format import OutputWriter, SchemaFormat, SchemaSetupError
from sluice.codecs.schema_registry import RegistryUnavailable, SchemaRejected, registry_call


def import_message_class(path: str, base_dir: Path, where: str) -> Any:
    """The class named ``package.module:Name`` (modules beside the pipeline file import too)."""
    module_name, _, attr = path.partition(":")
    if str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SchemaSetupError(f"{where}: cannot import module '{module_name}': {err}") from None
    cls = getattr(module, attr, None)
    if cls is None or not hasattr(cls, "DESCRIPTOR"):
        raise SchemaSetupError(f"{where}: module '{module_name}' has no protobuf message class '{attr}'")
    return cls


class ProtoWriter:
    """Output messages of the output class: serializer, context and result setter are made once."""

    __slots__ = ("out_class", "serialize", "ctx", "merge", "set_result")

    def __init__(self, out_class: Any, serializer: Any, ctx: Any, merge: bool,
                 set_result: Callable[[Any, Any], None]) -> None:
        self.out_class, self.serialize, self.ctx, self.merge, self.set_result = (
            out_class, serializer, ctx, merge, set_result)

    def write(self, record: Any, result: Any) -> bytes:
        out = self.out_class()
        if self.merge:
            out.MergeFromString(record.SerializeToString())
        self.set_result(out, result)
        value: bytes = self.serialize(out, self.ctx)
        return value


class ProtobufFormat(SchemaFormat):
    schema_type = "PROTOBUF"

    def __init__(self, *args: Any, message_type: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        self.in_class = import_message_class(message_type, self.base_dir, "codec.message_type")
        _check_path(self.in_class.DESCRIPTOR, self._path, f"codec.input_field '{self.input_field}'")
        self._deserializer = ProtobufDeserializer(self.in_class, {"use.deprecated.format": False}, None)
        self._writer: OutputWriter | None = None

    def deserialize(self, value: bytes) -> Any:
        return self._deserializer(value, None)

    def field(self, record: Any, path: tuple[str, ...]) -> Any:
        value = record
        for part in path:
            if value.DESCRIPTOR.fields_by_name[part].has_presence and not value.HasField(part):
                raise KeyError(part)
            value = getattr(value, part)
        return value

    def as_dict(self, record: Any) -> dict[str, Any]:
        from google.protobuf import json_format

        return json_format.MessageToDict(record, preserving_proto_field_name=True)

    def start(self, input_topics: list[str]) -> None:
        """Check the output class against the input's, register its schema (and imports) under the output
        subject by serializing an empty message: a valid one of any message type."""
        if self.writes_json:
            return
        assert self.output.message_type is not None  # the config requires it for protobuf outputs
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        out_class = import_message_class(self.output.message_type, self.base_dir, "sink.output.message_type")
        merge = self.output.mode == "merge"
        set_result = _result_setter(out_class.DESCRIPTOR, self.output.field)
        if merge:
            _check_superset(self.in_class.DESCRIPTOR, out_class.DESCRIPTOR, self.output.field)
        serializer = ProtobufSerializer(out_class, self.client, {"use.deprecated.format": False,
                                                                 "auto.register.schemas": True,
                                                                 **self.out.serializer_conf})
        ctx = self.out.context()
        try:
            registry_call(lambda: serializer(out_class(), ctx), "registering the output schema")
        except (RegistryUnavailable, SchemaRejected) as err:
            raise SchemaSetupError(str(err)) from None
        self._writer = ProtoWriter(out_class, serializer, ctx, merge, set_result)

    def writer_for(self, schema: Any) -> OutputWriter | None:
        return self._writer


def _check_path(descriptor: Any, path: tuple[str, ...], where: str) -> None:
    for part in path:
        field = descriptor.fields_by_name.get(part) if descriptor is not None else None
        if field is None:
            raise SchemaSetupError(f"{where}: message {descriptor.full_name if descriptor else '?'} has no "
                                   f"field '{part}'")
        descriptor = field.message_type


def _check_superset(in_desc: Any, out_desc: Any, result_field: str) -> None:
    if result_field in in_desc.fields_by_name:
        raise SchemaSetupError(f"the input message {in_desc.full_name} already has a field '{result_field}'; "
                               "choose another sink.output.field")
    for f in in_desc.fields:
        g = out_desc.fields_by_number.get(f.number)
        if g is None or g.name != f.name or g.type != f.type:
            raise SchemaSetupError(f"sink.output.message_type {out_desc.full_name} must hold the input's field "
                                   f"'{f.name}' = {f.number} of the same type (merge mode copies the input)")


def _result_setter(out_desc: Any, name: str) -> Callable[[Any, Any], None]:
    field = out_desc.fields_by_name.get(name)
    if field is None:
        raise SchemaSetupError(f"sink.output.message_type {out_desc.full_name} has no field '{name}' "
                               "(sink.output.field) for the result")
    if field.message_type is not None:  # a message or a map: from the result's JSON form
        from google.protobuf import json_format

        return lambda out, result: json_format.ParseDict({name: result}, out)
    if field.is_repeated:
        return lambda out, result: getattr(out, name).extend(result)
    return lambda out, result: setattr(out, name, result)
