"""``codec.format: avro``: Avro records with Schema Registry framing, read and written by confluent-kafka's
AvroDeserializer and AvroSerializer (fastavro underneath).

The output schema, unless ``sink.output.schema_file`` gives one, is the input's record schema plus the
result field, its Avro type derived from the engine's result schema (sluice/codecs/result_types.py);
it is registered under the output subject once per input schema id.

Reading: the first record of each schema id goes through confluent-kafka's deserializer; if that schema
stands alone (no references, not plain ``bytes``), its parsed form is kept and later records of the id are
read by fastavro directly -- what the deserializer does for them too (called without a serialization
context it runs no rules and reads with the writer's schema), without its per-record lookups, locks and
schema expansion, which cost as much as the decoding itself (``bench/operator_overhead.py --avro``). The
direct reader is kept only if it reads that first record exactly as the deserializer did.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from sluice.codecs.derived_format import DerivedSchemaFormat
from sluice.codecs.result_types import avro_type, merged_avro_record, result_avro_record
from sluice.codecs.subjects import no_subject

log = logging.getLogger(__name__)

_MAX_READERS = 1024  # schema ids looked at (a stream has a handful; the bound is for safety)
_UNSEEN: Any = object()


class AvroFormat(DerivedSchemaFormat):
    schema_type = "AVRO"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from fastavro import schemaless_reader

        self._deserializer = AvroDeserializer(self.client, conf={"subject.name.strategy": no_subject})
        self._read = schemaless_reader
        # 5-byte header (magic 0, schema id) -> parsed writer schema, or None: the deserializer's alone
        self._readers: dict[bytes, Any] = {}

    def deserialize(self, value: bytes) -> Any:
        reader = self._readers.get(value[:5], _UNSEEN)
        if reader is not _UNSEEN and reader is not None:
            return self._read(io.BytesIO(value[5:]), reader, None)
        record = self._deserializer(value, None)
        if reader is _UNSEEN and len(self._readers) < _MAX_READERS:
            self._learn(value, record)
        return record

    def _learn(self, value: bytes, record: Any) -> None:
        """After the deserializer read ``value`` as ``record``: keep a direct reader for its schema id, if
        the schema stands alone and the direct reader gives the same record."""
        header = value[:5]
        if value[:1] != b"\x00":  # a GUID header (magic byte 1): left to the deserializer
            self._readers[header] = None
            return
        schema_id = int.from_bytes(value[1:5], "big")
        try:
            # cached by the client: the deserializer just asked
            parsed = _standalone(self.client.get_schema(schema_id))
            if parsed is not None and self._read(io.BytesIO(value[5:]), parsed, None) != record:
                log.info("schema id %s: read through confluent-kafka's deserializer only", schema_id)
                parsed = None
        except Exception as err:  # noqa: BLE001 - tried again at the id's next record
            log.debug("schema id %s: no direct reader yet (%s)", schema_id, err)
            return
        self._readers[header] = parsed

    def derive(self, input_schema: Any, result_schema: dict[str, Any]) -> dict[str, Any]:
        field = self.output.field
        result_type = avro_type(result_schema, name=field)
        if self.output.mode == "merge":
            return merged_avro_record(input_schema, field, result_type)
        named = input_schema if isinstance(input_schema, dict) else {}
        name = str(named.get("name", "Record")).rsplit(".", 1)[-1]
        return result_avro_record(f"{name}Result", named.get("namespace"), field, result_type)

    def record_name(self, out_schema: dict[str, Any]) -> str | None:
        """The full name, as the serializer's record strategies use it."""
        name, namespace = str(out_schema.get("name", "")), out_schema.get("namespace")
        if not name:
            return None
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def serializer(self, schema: Any) -> Any:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        conf = {"auto.register.schemas": True, **self.out.serializer_conf}
        return _DirectAfterFirst(AvroSerializer(self.client, schema, conf=conf), schema)


class _DirectAfterFirst:
    """Writing, the same way as reading: confluent-kafka's serializer for the first record (it finds the
    output schema's id, registered at setup, and says what the bytes must be); then, if the schema stands
    alone and fastavro writes that record to the same bytes, fastavro directly with the same header. With
    the settings above the serializer runs no rules and no validation, so that is all it does per record.
    The first record decides: when it cannot go direct, the serializer writes every record and the schema
    is not looked at again (the output schema and the serializer's framing are the same for all)."""

    __slots__ = ("_serializer", "_schema", "_parsed", "_header", "_write", "_undecided")

    def __init__(self, serializer: Any, schema: Any) -> None:
        from fastavro import schemaless_writer

        self._serializer, self._schema = serializer, schema  # schema: the registry Schema of the output
        self._parsed: Any = None
        self._header: bytes | None = None
        self._write = schemaless_writer
        self._undecided = True

    def __call__(self, obj: Any, ctx: Any) -> bytes:
        if self._header is not None:
            out = io.BytesIO()
            out.write(self._header)
            self._write(out, self._parsed, obj)
            return out.getvalue()
        value: bytes = self._serializer(obj, ctx)
        if self._undecided:
            self._learn(obj, value)
        return value

    def _learn(self, obj: Any, value: bytes) -> None:
        self._undecided = False
        if value[:1] != b"\x00":
            return
        try:
            parsed = _standalone(self._schema)
            if parsed is None:
                return
            out = io.BytesIO()
            out.write(value[:5])
            self._write(out, parsed, obj)
        except Exception as err:  # noqa: BLE001 - the serializer keeps writing these records
            log.debug("no direct Avro writer (%s)", err)
            return
        if out.getvalue() == value:
            self._parsed, self._header = parsed, value[:5]


def _standalone(schema: Any) -> Any:
    """fastavro's parsed form of a registry Schema that fastavro can read and write alone, else None: one
    with references needs confluent-kafka to resolve its named types, and plain ``bytes`` is framed raw."""
    from fastavro import parse_schema

    if schema.references or schema.schema_str is None:
        return None
    parsed = parse_schema(json.loads(schema.schema_str))
    if parsed == "bytes" or (isinstance(parsed, dict) and parsed.get("type") == "bytes"):
        return None
    return parsed
