"""RecordCodec.decode: bounded before any recursive work, and every failure a CodecError with a reason."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codecs.record_codec import CodecError, RecordCodec
from sluice.config import Codec, Output

codec = RecordCodec(Codec(max_depth=16, max_record_bytes=10_000), Output())


def nest(shape: str, levels: int) -> bytes:
    """A record whose field ``x`` nests ``levels`` more levels (the record itself is one level)."""
    opens, closes = {"list": ("[", "]"), "object": ('{"a":', "}"), "mixed": ('[{"a":', "}]")}[shape]
    per = 2 if shape == "mixed" else 1
    inner = opens * (levels // per) + "1" + closes * (levels // per)
    return ('{"text": "t", "x": ' + inner + "}").encode()


@pytest.mark.parametrize("shape", ["list", "object", "mixed"])
def test_the_depth_limit_is_exact(shape: str) -> None:
    ok = nest(shape, 14 if shape == "mixed" else 15)  # 16 levels with the record's own
    document, value = codec.decode(ok)
    assert value == "t" and document["x"]
    with pytest.raises(CodecError, match=r"nests \d+ levels deep; codec.max_depth allows 16"):
        codec.decode(nest(shape, 16))


@pytest.mark.parametrize("levels", [1_000, 100_000, 1_000_000])
@pytest.mark.parametrize("shape", ["list", "object", "mixed"])
def test_very_deep_records_are_refused_before_decoding(shape: str, levels: int) -> None:
    deep = RecordCodec(Codec(max_record_bytes=20_000_000), Output())  # default depth limit (128)
    started = time.perf_counter()
    with pytest.raises(CodecError, match="codec.max_depth allows 128") as caught:
        deep.decode(nest(shape, levels))
    assert caught.value.stage == "decode"
    assert time.perf_counter() - started < 2.0


def test_brackets_inside_strings_do_not_count() -> None:
    wide = RecordCodec(Codec(max_depth=16), Output())
    value = json.dumps({"text": "[" * 50_000 + '\\"{' * 1000, "y": ["]" * 10]}).encode()
    document, text = wide.decode(value)
    assert text == "[" * 50_000 + '\\"{' * 1000 and document["y"] == ["]" * 10]


def test_the_size_limit_comes_first_and_names_the_setting() -> None:
    with pytest.raises(CodecError, match="10001 bytes; codec.max_record_bytes allows 10000"):
        codec.decode(b" " * 10_001)
    raw = RecordCodec(Codec(format="raw", max_record_bytes=10), Output())
    assert raw.decode(b"0123456789") == ("0123456789", "0123456789")
    with pytest.raises(CodecError, match="codec.max_record_bytes"):
        raw.decode(b"0123456789a")


hostile = st.one_of(
    st.binary(max_size=300),
    st.integers(1, 200).flatmap(lambda n: st.sampled_from(["list", "object", "mixed"]).map(lambda s: nest(s, n))),
    st.text(max_size=50).map(lambda t: json.dumps({"text": t}).encode()),
    st.sampled_from([b'{"text": 1e999999}', b'{"text": ' + b"9" * 5000 + b"}", b'{"text": NaN}', b'{"text": "\\ud800"}',
                     b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "a\x00"}', b'{"text": []}', b"[]", b"null", b"",
                     b'{"text": "x"' + b" " * 20_000 + b"}", b'{"text": "' + b"\\" * 9999 + b'"}']),
)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(hostile)
def test_decode_raises_nothing_but_codec_errors(value: bytes) -> None:
    try:
        codec.decode(value)
    except CodecError as err:
        assert err.stage == "decode" and str(err)
