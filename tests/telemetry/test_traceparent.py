"""W3C traceparent parsing and bulk generation, malformed headers included."""

from __future__ import annotations

import re

import pytest

from sluice.telemetry.traceparent import HEADER_LEN, find, format_traceparent, new_traceparents, parse

VALID = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
_PATTERN = re.compile(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-00")


def test_a_valid_header_is_parsed_into_ids_and_flags() -> None:
    parent = parse(VALID)
    assert parent is not None
    assert parent.trace_id == b"4bf92f3577b34da6a3ce929d0e0e4736"
    assert parent.parent_id == b"00f067aa0ba902b7"
    assert parent.sampled
    unsampled = parse(VALID[:-2] + b"00")
    assert unsampled is not None and not unsampled.sampled
    assert parse(VALID.decode()) == parent  # str values too


@pytest.mark.parametrize("value", [
    None, b"", b"garbage",
    VALID[:-1],  # too short
    VALID + b"0",  # version 00 with trailing data
    VALID.upper(),  # upper-case hex
    b"ff" + VALID[2:],  # forbidden version
    b"00-" + b"0" * 32 + VALID[35:],  # all-zero trace id
    VALID[:36] + b"0" * 16 + VALID[52:],  # all-zero parent id
    VALID.replace(b"-", b"_"),
    b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  # not hex
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",  # not ascii
])
def test_malformed_headers_count_as_absent(value: bytes | str | None) -> None:
    assert parse(value) is None


def test_a_later_version_may_carry_more_fields_after_a_dash() -> None:
    assert parse(b"01" + VALID[2:] + b"-extra") is not None
    assert parse(b"01" + VALID[2:] + b"x") is None


def test_find_returns_the_position_of_the_first_traceparent() -> None:
    headers = [("a", b"1"), ("traceparent", VALID), ("traceparent", b"x")]
    at, parent = find(headers)
    assert at == 1 and parent is not None and parent.trace_id == VALID[3:35]
    assert find([("a", b"1")]) == (-1, None)
    assert find([("traceparent", b"junk")]) == (0, None)


def test_format_round_trips_through_parse() -> None:
    value = format_traceparent(b"a" * 32, b"b" * 16, 1)
    assert value == b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    parent = parse(value)
    assert parent is not None and parent.sampled


def test_new_traceparents_are_valid_unsampled_and_distinct() -> None:
    n = 1000
    blob = new_traceparents(n)
    assert len(blob) == n * HEADER_LEN
    values = [blob[i * HEADER_LEN:(i + 1) * HEADER_LEN] for i in range(n)]
    assert all(_PATTERN.fullmatch(v) for v in values)
    parsed = [parse(v) for v in values]
    assert all(p is not None and not p.sampled for p in parsed)
    assert len({p.trace_id for p in parsed if p}) == n
    assert len({p.parent_id for p in parsed if p}) == n
    assert new_traceparents(0) == b""


def test_an_all_zero_draw_is_patched_into_a_valid_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sluice.telemetry.traceparent.os.urandom", lambda size: bytes(size))
    blob = new_traceparents(2)
    assert parse(blob[:HEADER_LEN]) is not None and parse(blob[HEADER_LEN:]) is not None
