"""Records framed for a Schema Registry (a magic byte and a schema id before the payload): what the avro,
protobuf and json_schema formats share. Each format is one subclass in a module of its own (avro and
json_schema through :mod:`sluice.codecs.derived_format`); subjects are named in :mod:`sluice.codecs.subjects`.

Per record, on the intake thread, :meth:`SchemaFormat.decode` reads the schema id, finds the record's
:class:`OutputWriter` in a dict keyed by that id, and runs confluent-kafka's deserializer (whose client
caches the schema by id). Only the first record of each schema id reaches the registry: to fetch its
schema and, for a derived output, to register the output schema (the input's record schema plus the result
field) under the output subject. A schema change in the stream is a new id, and so just works.

Per record, on the engine thread, :meth:`SchemaFormat.encode` runs that writer: confluent-kafka's
serializer with an output schema whose id the client has cached since decode. The engine thread never
waits for the registry.

What goes wrong, and where it ends (sluice/codecs/schema_registry.py sorts the registry's answers):

* the registry is down, slow or refuses the credentials: :class:`RegistryUnavailable` propagates; the
  runner pauses the partition and retries the record later (sluice/operator/stalls.py);
* bytes that do not decode, an unknown schema id, a missing input field: :class:`CodecError` ('decode');
* the registry rejects the output schema derived for an input schema: :class:`CodecError` ('encode') for
  every record of that input schema, remembered so the registry is asked once.
"""

from __future__ import annotations

import logging
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sluice.codecs.codec_error import CodecError
from sluice.codecs.schema_registry import (
    RegistryUnavailable,
    SchemaRejected,
    UnknownSchema,
    registry_call,
    unavailable_reason,
)
from sluice.codecs.subjects import OutputSubject
from sluice.config import Codec, Output

log = logging.getLogger(__name__)

_MAX_REFUSED_IDS = 1024  # schema ids remembered as unknown or refused (garbage bytes can name any id)
_MAX_START_VERSIONS = 50  # input schema versions whose outputs are set up at start


class SchemaSetupError(Exception):
    """The output schema cannot be set up at start (derivation, registration, compatibility). One line."""


class OutputWriter(Protocol):
    """Encodes the output of records of one input schema. Engine thread; never calls the registry."""

    def write(self, record: Any, result: Any) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Decoded:
    """The document of a schema-registry record: the decoded record and how its output is written."""

    record: Any  # a dict (avro, json_schema) or a protobuf message
    writer: OutputWriter | None  # None: the output is JSON, written by RecordCodec


@dataclass(frozen=True, slots=True)
class _Refused:
    """An input schema id whose records cannot be handled; ``stage`` and ``reason`` go to each one."""

    stage: str
    reason: str


class SchemaFormat(ABC):
    """One format's decode and encode, for one pipeline. ``decode`` runs on the intake thread only."""

    schema_type: str  # the registry's name for the format: AVRO, PROTOBUF, JSON

    def __init__(self, client: Any, codec: Codec, output: Output, out_topic: str, writes_json: bool,
                 result_schema: dict[str, Any] | None, base_dir: Path) -> None:
        self.client = client
        self.output = output
        self.writes_json = writes_json  # sink.output.format json: RecordCodec writes JSON of as_dict(record)
        self.result_schema = result_schema  # the engine's, or None
        self.base_dir = base_dir
        self.out = OutputSubject(out_topic, output.subject_name_strategy)
        self.input_field = codec.input_field
        self._path = () if codec.input_field == "." else tuple(codec.input_field.split("."))
        # header bytes (and schema id, or GUID, for those set up at start) -> the writer of its records
        self._writers: dict[Any, OutputWriter | None | _Refused] = {}
        self._num_refused = 0

    # ------------------------------------------------------------------------------ what a format gives

    @abstractmethod
    def deserialize(self, value: bytes) -> Any:
        """The record (confluent-kafka's deserializer). Raises whatever it raises."""

    @abstractmethod
    def writer_for(self, schema: Any) -> OutputWriter | None:
        """The output writer for records written with ``schema`` (a registry Schema): registers a derived
        output schema. Registry errors propagate. None when the output is JSON."""

    @abstractmethod
    def field(self, record: Any, path: tuple[str, ...]) -> Any:
        """The value at ``path`` in ``record``; raises KeyError(part) where a part is missing (or null)."""

    def as_dict(self, record: Any) -> dict[str, Any]:
        """The record as a JSON object (JSON outputs, ``sink.output.key: field:...``)."""
        return dict(record)

    def start(self, input_topics: list[str]) -> None:
        """At start: derive and register the output schema of each version of each input topic's subject,
        oldest first (up to the last ``_MAX_START_VERSIONS``), so the output subject's versions follow the
        input's and an incompatible output fails now, not record by record. Raises SchemaSetupError."""
        from confluent_kafka.schema_registry import topic_subject_name_strategy
        from confluent_kafka.serialization import MessageField, SerializationContext

        for topic in input_topics:
            subject = topic_subject_name_strategy(SerializationContext(topic, MessageField.VALUE), None)
            try:
                versions = registry_call(lambda s=subject: self.client.get_versions(s),  # type: ignore[misc]
                                         f"the versions of subject {subject}")
                for version in sorted(versions)[-_MAX_START_VERSIONS:]:
                    registered = registry_call(
                        lambda s=subject, v=version: self.client.get_version(s, v),  # type: ignore[misc]
                        f"version {version} of subject {subject}")
                    self._writers[registered.schema_id] = self._prepare(registered.schema_id, registered.schema)
                    # what the deserializer asks for at its first record of this id: cached now
                    registry_call(lambda i=registered.schema_id: self.client.get_schema(i),  # type: ignore[misc]
                                  f"schema id {registered.schema_id}")
            except UnknownSchema:
                log.info("subject %s has no schema yet: its output schema is derived at its first record", subject)
            except (RegistryUnavailable, SchemaRejected, ValueError) as err:
                raise SchemaSetupError(f"output schema for input subject {subject}: {err}") from None

    # ------------------------------------------------------------------------------------ per record

    def decode(self, value: bytes) -> tuple[Decoded, Any]:
        """(document, model input). Raises CodecError for the record's faults, RegistryUnavailable otherwise.

        The record's own faults come first (unknown schema id, undecodable bytes, missing field); the output
        schema of a new input schema id is set up only for a record that got that far."""
        # Known schemas are found by the header's bytes (magic byte and id: value[:5]; a GUID header is 17
        # bytes): one slice and one dict lookup per record. A new header is parsed by confluent-kafka's own
        # reader, which also rejects a bad magic byte.
        header = value[:17] if value[:1] == b"\x01" else value[:5]
        writer = self._writers.get(header, _MISSING)
        schema_id: Any = None
        schema = None  # set for the first record of a new schema id: its output is set up below
        if writer is _MISSING:
            schema_id = self._schema_id(value)
            writer = self._writers.get(schema_id, _MISSING)  # set up at start, or refused
            if writer is _MISSING:
                schema = self._fetch(header, schema_id)
            else:
                self._writers[header] = writer
        if isinstance(writer, _Refused):
            raise CodecError(writer.stage, writer.reason)
        try:
            record = self.deserialize(value)
        except Exception as err:
            reason = unavailable_reason(err)
            schema_id = self._schema_id(value)
            if reason is not None:
                raise RegistryUnavailable(f"decoding a record of schema id {schema_id}: {reason}") from None
            raise CodecError("decode", f"the value does not decode with schema id {schema_id}: "
                                       f"{type(err).__name__}: {err}") from None
        try:
            model_input = self.field(record, self._path) if self._path else record
        except KeyError:
            raise CodecError("decode", f"the record has no field '{self.input_field}' (or it is null)") from None
        if schema is not None:
            writer = self._writer_of(header, schema_id, schema)
            if isinstance(writer, _Refused):
                raise CodecError(writer.stage, writer.reason)
        return Decoded(record, writer), model_input

    def encode(self, document: Decoded, result: Any) -> bytes:
        """The output value (engine thread). Raises CodecError('encode', ...)."""
        assert document.writer is not None  # RecordCodec writes JSON outputs itself
        tolist = getattr(result, "tolist", None)  # numpy arrays and scalars from engines
        if callable(tolist):
            result = tolist()
        try:
            return document.writer.write(document.record, result)
        except Exception as err:  # a result that does not fit the output schema
            raise CodecError("encode", f"the result does not fit the output schema: {type(err).__name__}: "
                                       f"{err}") from None

    # ------------------------------------------------------------------------------------- internals

    def _schema_id(self, value: bytes) -> Any:
        from confluent_kafka.schema_registry import prefix_schema_id_deserializer
        from confluent_kafka.schema_registry.serde import SchemaId
        from confluent_kafka.serialization import SerializationError

        schema_id = SchemaId(self.schema_type)
        try:
            prefix_schema_id_deserializer(value, None, schema_id)
        except (SerializationError, struct.error, ValueError, IndexError, EOFError) as err:
            raise CodecError("decode", "the value does not start with a schema registry header (magic byte 0 and "
                                       f"a 4-byte schema id): {err or type(err).__name__}") from None
        return schema_id.id if schema_id.id is not None else schema_id.guid

    def _fetch(self, header: bytes, schema_id: Any) -> Any:
        """The schema of a new id (the client caches it for the deserializer). RegistryUnavailable propagates,
        and the record is tried again later; an unknown id is remembered and raised as the record's fault."""
        what = f"schema id {schema_id}"
        try:
            if isinstance(schema_id, int):
                return registry_call(lambda: self.client.get_schema(schema_id), what)
            return registry_call(lambda: self.client.get_schema_by_guid(str(schema_id)), what)
        except UnknownSchema:
            refused = self._refuse(header, "decode", f"unknown schema id {schema_id}: the schema registry has "
                                                     "no such schema")
        except SchemaRejected as err:
            refused = self._refuse(header, "decode", str(err))
        raise CodecError(refused.stage, refused.reason)

    def _writer_of(self, header: bytes, schema_id: Any, schema: Any) -> OutputWriter | None | _Refused:
        """Set up the output of a new input schema id (RegistryUnavailable propagates)."""
        try:
            writer: OutputWriter | None | _Refused = self._prepare(schema_id, schema)
        except (SchemaRejected, UnknownSchema, ValueError) as err:
            return self._refuse(header, "encode", f"no output schema for input schema id {schema_id}: {err}")
        self._writers[header] = self._writers[schema_id] = writer
        return writer

    def _prepare(self, schema_id: Any, schema: Any) -> OutputWriter | None:
        writer = self.writer_for(schema)
        log.info("input schema id %s: outputs %s", schema_id, "as JSON" if writer is None else "set up")
        return writer

    def _refuse(self, header: bytes, stage: str, reason: str) -> _Refused:
        log.warning("records with schema header %s go to the dead-letter topic: %s", header.hex(), reason)
        if self._num_refused >= _MAX_REFUSED_IDS:
            self._writers = {k: w for k, w in self._writers.items() if not isinstance(w, _Refused)}
            self._num_refused = 0
        refused = self._writers[header] = _Refused(stage, reason)
        self._num_refused += 1
        return refused


_MISSING: Any = object()
