"""The nesting depth of a decoded JSON value, walked with an explicit stack: the reference that the
codec's non-recursive scan of the raw text (sluice/codecs/depth.py) is compared against."""

from __future__ import annotations

from typing import Any


def depth_of(value: Any) -> int:
    """Levels of lists and dicts in ``value`` (``{"a": [1]}`` is 2; a scalar is 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, level + 1)
            stack.extend((c, level + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
