"""W3C trace context (``traceparent``) in Kafka headers: parse, format, and fresh ids in bulk.

The operator reads and writes ``traceparent`` itself instead of going through OpenTelemetry's propagator:
every output record carries one (so it joins its input's trace even when the trace is not sampled), and
the propagator's per-record objects would cost more than the rest of the operator's work on a record.

Format (https://www.w3.org/TR/trace-context/#traceparent-header), version 00::

    00-<trace-id: 32 lower-hex>-<parent-id: 16 lower-hex>-<flags: 2 hex>     (55 bytes)

A higher version may append ``-...`` after the flags; an all-zero id, upper-case hex, version ``ff`` or a
wrong length make the header invalid, and an invalid header counts as absent (a new trace starts).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
HEADER_LEN = 55  # bytes of a version-00 traceparent
SAMPLED = 0x01  # the sampled bit of trace-flags

_HEX = frozenset(b"0123456789abcdef")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16
_PREFIX = np.frombuffer(b"00-", dtype=np.uint8)
_SUFFIX = np.frombuffer(b"-00", dtype=np.uint8)  # unsampled


class TraceParent(NamedTuple):
    """A valid incoming traceparent. Ids stay as the lower-hex bytes of the header (no int round trip)."""

    trace_id: bytes  # 32 lower-hex bytes
    parent_id: bytes  # 16 lower-hex bytes
    flags: int  # trace-flags; bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)


def parse(value: bytes | str | None) -> TraceParent | None:
    """The traceparent in ``value``, or None when it is missing or invalid in any way."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = value.encode("ascii")
        except UnicodeEncodeError:
            return None
    value = value.strip(b" \t")
    if len(value) < HEADER_LEN or value[2:3] != b"-" or value[35:36] != b"-" or value[52:53] != b"-":
        return None
    version, trace_id, parent_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if not (_is_hex(version) and _is_hex(trace_id) and _is_hex(parent_id) and _is_hex(flags)):
        return None
    if version == b"ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    if version == b"00" and len(value) != HEADER_LEN:
        return None  # version 00 has no room for more fields
    if len(value) > HEADER_LEN and value[55:56] != b"-":
        return None  # a later version may only add fields after another dash
    return TraceParent(trace_id, parent_id, int(flags, 16))


def format_traceparent(trace_id: bytes, span_id: bytes, flags: int) -> bytes:
    """A version-00 traceparent header value (ids as lower-hex bytes)."""
    return b"00-%s-%s-%02x" % (trace_id, span_id, flags & 0xFF)


def find(headers: list[tuple[str, bytes]]) -> tuple[int, TraceParent | None]:
    """Index and parsed value of the first ``traceparent`` header; (-1, None) when there is none.

    A present but invalid header gives (index, None): the caller drops it and starts a new trace.
    """
    for i, (key, value) in enumerate(headers):
        if key == TRACEPARENT:
            return i, parse(value)
    return -1, None


def new_traceparents(n: int) -> bytes:
    """``n`` fresh unsampled version-00 traceparents, 55 bytes each, concatenated.

    Record ``i``'s header is ``blob[55*i : 55*i+55]``; its trace id is bytes 3..35 and its span id bytes
    36..52. Random from ``os.urandom`` (128-bit trace ids, 64-bit span ids, never all zero), hex-encoded
    with ``bytes.hex`` and laid out with numpy in one pass: the per-record cost is the slice.
    """
    if n <= 0:
        return b""
    raw = os.urandom(24 * n)  # per record: 16 trace-id bytes, 8 span-id bytes
    words = np.frombuffer(raw, dtype=np.uint64).reshape(n, 3)  # trace id: words 0-1, span id: word 2
    if not (words[:, 2].all() and (words[:, 0] | words[:, 1]).all()):
        raw = _no_zero_ids(np.frombuffer(raw, dtype=np.uint8).reshape(n, 24)).tobytes()
    digits = np.frombuffer(raw.hex().encode("ascii"), dtype=np.uint8).reshape(n, 48)  # (n, 48) lower hex
    out = np.empty((n, HEADER_LEN), dtype=np.uint8)
    out[:, 0:3] = _PREFIX
    out[:, 3:35] = digits[:, :32]
    out[:, 35] = ord("-")
    out[:, 36:52] = digits[:, 32:]
    out[:, 52:55] = _SUFFIX
    return out.tobytes()


def _no_zero_ids(raw: np.ndarray) -> np.ndarray:
    """All-zero ids are invalid; one in 2**64 draws is one, so patch instead of redrawing."""
    zero_trace = ~raw[:, :16].any(axis=1)
    zero_span = ~raw[:, 16:].any(axis=1)
    if zero_trace.any() or zero_span.any():
        raw = raw.copy()
        raw[zero_trace, 15] = 1
        raw[zero_span, 23] = 1
    return raw


def _is_hex(part: bytes) -> bool:
    return _HEX.issuperset(part)
