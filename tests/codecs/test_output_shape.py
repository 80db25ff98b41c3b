"""Output shaping by sink.output: merge or result alone, under the field; the key kept, dropped or read from
the record -- the same shape for JSON and for the registry formats that write dicts."""

from __future__ import annotations

import pytest

from sluice.codecs.output_shape import OutputShape
from sluice.codecs.record_codec import CodecError, RecordCodec
from sluice.config import Codec, Output


def test_merge_keeps_the_input_and_result_mode_keeps_the_result_alone() -> None:
    doc = {"id": 7, "text": "hi"}
    merged = OutputShape.of(Output(field="tag")).document(doc, "HI")
    assert merged == {"id": 7, "text": "hi", "tag": "HI"} and doc == {"id": 7, "text": "hi"}  # input untouched
    assert OutputShape.of(Output(mode="result", field="tag")).document(doc, "HI") == {"tag": "HI"}
    assert OutputShape.of(Output(field="tag")).document("raw text", "HI") == {"input": "raw text", "tag": "HI"}


def test_keys_are_kept_dropped_or_taken_from_a_field_and_a_missing_field_is_the_record_s_error() -> None:
    doc = {"user": {"id": "u1", "n": 3, "none": None}}
    def key(spec: str, document: object = doc) -> bytes | None:
        return RecordCodec(Codec(), Output(key=spec)).output_key(document, b"in")
    assert key("input") == b"in" and key("none") is None
    assert key("field:user.id") == b"u1" and key("field:user.n") == b"3" and key("field:user.none") == b"null"
    with pytest.raises(CodecError, match="no key field 'user.missing'") as info:
        key("field:user.missing")
    assert info.value.stage == "encode"
