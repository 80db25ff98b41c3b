"""Record codecs: bytes -> (document, model input) on the way in; (document, result) -> bytes on the way out
(what the output holds is shaped by output_shape.py; this module reads and writes the bytes).

Every failure the codec foresees is a :class:`CodecError` whose message says what was wrong with *that
record*; the runner sends the record to the dead-letter topic with it and goes on (and does the same with
any other exception raised here: sluice/operator/failures/containment.py).

Decoding is bounded before any recursive work: a value larger than ``codec.max_record_bytes`` is refused
unread, and a JSON value nested deeper than ``codec.max_depth`` is refused after a linear, non-recursive
scan (sluice/codecs/depth.py) -- a decoder recurses once per level, and 100,000 levels make it raise.

JSON and raw records are handled here, and OpenAI's batch lines (openai_batch.py: a JSON line read as a
chat request, answered with OpenAI's response line). The Schema Registry formats (avro, protobuf, json_schema) are one
module each behind :class:`~sluice.codecs.schema_format.SchemaFormat`, given as ``schemas``; their decode
may also raise :class:`~sluice.codecs.schema_registry.RegistryUnavailable`, which is not the record's fault.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from sluice.codecs import openai_batch
from sluice.codecs.codec_error import CodecError
from sluice.codecs.depth import may_exceed, nesting_depth
from sluice.codecs.output_shape import OutputShape, get_path
from sluice.config import Codec, Output

if TYPE_CHECKING:
    from sluice.codecs.schema_format import SchemaFormat

__all__ = ["CodecError", "RecordCodec"]


def _enc_hook(value: Any) -> Any:
    # numpy arrays / scalars and bytes from engines; anything else is an encode error
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"a result of type {type(value).__name__} is not JSON-serialisable")


# msgspec: several times faster than the json module on both sides, which matters per record.
# Note: it writes non-finite floats (NaN, inf) as null.
_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.json.Decoder()


@dataclass(frozen=True)
class RecordCodec:
    """Decodes input records and encodes output records, as the pipeline's ``codec`` and ``sink.output`` say."""

    codec: Codec
    output: Output
    schemas: SchemaFormat | None = None  # avro, protobuf, json_schema (sluice/codecs/registry_formats.py builds it)
    binary: bool = False  # format raw: the value's bytes are the input (image files), not UTF-8 text
    shape: OutputShape = field(init=False)  # what an output holds (sink.output)
    _input_path: tuple[str, ...] = field(init=False)  # codec.input_field, split; () for the whole record

    def __post_init__(self) -> None:
        name = self.codec.input_field
        object.__setattr__(self, "_input_path", () if name == "." else tuple(name.split(".")))
        object.__setattr__(self, "shape", OutputShape.of(self.output))

    def decode(self, value: bytes | None) -> tuple[Any, Any]:
        """Return (document, model input). Raises CodecError('decode', ...)."""
        if value is None:
            raise CodecError("decode", "the record has no value (a tombstone)")
        codec = self.codec
        if len(value) > codec.max_record_bytes:
            raise CodecError("decode", f"the value is {len(value)} bytes; codec.max_record_bytes allows "
                                       f"{codec.max_record_bytes}")
        if self.schemas is not None:  # avro, protobuf, json_schema: their schema bounds the nesting
            return self.schemas.decode(value)
        if codec.format == "raw":
            if self.binary:
                return value, value
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CodecError("decode", f"the value is not valid UTF-8: {err.reason} at byte {err.start}") from None
            return text, text
        # a value shorter than the limit cannot hold more brackets than it: no pass over it at all
        if len(value) > codec.max_depth and may_exceed(value, codec.max_depth) and \
                (depth := nesting_depth(value)) > codec.max_depth:
            raise CodecError("decode", f"the JSON nests {depth} levels deep; codec.max_depth allows "
                                       f"{codec.max_depth}")
        try:
            document = _decoder.decode(value)
        except msgspec.DecodeError as err:
            raise CodecError("decode", f"the value is not valid JSON: {err}") from None
        except RecursionError:  # cannot happen within max_depth's bound; kept so that it never stops a run
            raise CodecError("decode", "the JSON nests too deeply to decode") from None
        if not isinstance(document, dict):
            raise CodecError("decode", f"expected a JSON object, got a JSON {type(document).__name__}")
        if codec.format == "openai-batch":
            return document, openai_batch.read_request(document)
        try:
            path = self._input_path
            model_input = document[path[0]] if len(path) == 1 else get_path(document, path)  # () -> document
        except KeyError:
            raise CodecError("decode", f"the record has no field '{self.codec.input_field}'") from None
        return document, model_input

    def encode(self, document: Any, result: Any) -> bytes:
        """The output value for one record, shaped by ``sink.output`` (output_shape.py). Raises
        CodecError('encode', ...)."""
        if self.schemas is not None:
            if not self.schemas.writes_json:
                return self.schemas.encode(document, result)
            document = self.schemas.as_dict(document.record)
        if self.codec.format == "openai-batch":
            return openai_batch.write_response(document, result)
        try:
            return _encoder.encode(self.shape.document(document, result))
        except (TypeError, ValueError, OverflowError) as err:
            raise CodecError("encode", f"the result cannot be encoded as JSON: {err}") from None

    def output_key(self, document: Any, input_key: bytes | None) -> bytes | None:
        """The key of the output record (input key by default)."""
        shape = self.shape
        if shape.key_path is None:
            return input_key if shape.key == "input" else None
        if self.schemas is not None:
            document = self.schemas.as_dict(document.record)
        value = shape.key_field(document)
        return value.encode("utf-8") if isinstance(value, str) else _encoder.encode(value)
