"""Output shaping: what an output record holds, as ``sink.output`` says -- before any format writes it.

* its value: ``merge`` keeps the input record and adds the result under ``field``; ``result`` is
  ``{field: result}`` alone (a non-object input, such as raw text, is kept under ``input``);
* its key: ``input`` keeps the input's key, ``none`` drops it, ``field:a.b`` takes it from the input record.

The JSON codec (codec.py) and the schema registry formats that write dicts (avro, json_schema) shape their
outputs here and then encode them their own way; protobuf shapes into its output class by field number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.codecs.codec_error import CodecError
from sluice.config import Output


def get_path(document: Any, path: tuple[str, ...]) -> Any:
    """A dotted path into nested dicts; a missing part raises KeyError."""
    value = document
    for part in path:
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


@dataclass(frozen=True, slots=True)
class OutputShape:
    """The shape of every output record of one pipeline."""

    merge: bool  # the input record plus the result; else the result alone
    field: str  # where the result goes
    key: str  # input | none | field:<dotted.path>
    key_path: tuple[str, ...] | None  # the dotted path, for field:...

    @classmethod
    def of(cls, output: Output) -> OutputShape:
        key_path = tuple(output.key[6:].split(".")) if output.key.startswith("field:") else None
        return cls(merge=output.mode == "merge", field=output.field, key=output.key, key_path=key_path)

    def document(self, document: Any, result: Any) -> dict[str, Any]:
        """The output value as a dict, before encoding."""
        if not self.merge:
            return {self.field: result}
        if isinstance(document, dict):
            out = dict(document)
            out[self.field] = result
            return out
        return {"input": document, self.field: result}

    def key_field(self, document: Any) -> Any:
        """With ``key: field:a.b``: the value at that path of ``document`` (a dict), for the caller to encode.
        Raises CodecError('encode') when the field is missing."""
        assert self.key_path is not None, "key_field is for key: field:<path>"
        try:
            return get_path(document, self.key_path)
        except KeyError:
            raise CodecError("encode", f"the record has no key field '{self.key[6:]}'") from None
