"""nesting_depth: the non-recursive depth scan agrees with the depth of the decoded value, on any JSON."""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.codecs.depth import may_exceed, nesting_depth
from tests.support.json_depth import depth_of

# strings full of what could fool a scan: brackets, quotes, backslashes, escapes
tricky_text = st.text(alphabet=st.sampled_from(list('[]{}"\\/,:ab\n\t\u00e9\U0001f600')), max_size=12)
leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), tricky_text)
values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(tricky_text, inner, max_size=3)),
                      max_leaves=40)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(values, st.booleans(), st.booleans())
@example({"text": "[[[[", "x": ["\\\"[", {"\\": "]]"}]}, False, False)
def test_depth_matches_the_decoded_value(value: Any, ascii_only: bool, indent: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=2 if indent else None).encode()
    assert nesting_depth(text) == depth_of(value)
    if not may_exceed(text, depth_of(value)):  # the pre-check may only say "cannot exceed" when true
        assert nesting_depth(text) <= depth_of(value)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.binary(max_size=200))
def test_any_bytes_give_a_number(value: bytes) -> None:
    assert nesting_depth(value) >= 0


def test_pathological_inputs_are_scanned_in_linear_time() -> None:
    n = 2_000_000
    cases = {
        b"[" * n: n,
        b'{"a":' * (n // 5) + b"1" + b"}" * (n // 5): n // 5,
        b'"\\' * n: 0,  # an unterminated string of escapes
        b'"[' * n: n // 2,  # every other bracket inside a string
        b'["\\\\",' * (n // 6) + b"]" * (n // 6): n // 6,  # escaped backslashes before closing quotes
    }
    for text, depth in cases.items():
        started = time.perf_counter()
        assert nesting_depth(text) == depth
        assert time.perf_counter() - started < 2.0, f"{text[:20]!r}: {time.perf_counter() - started:.2f} s"
