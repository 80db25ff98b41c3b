"""How deeply a JSON text nests, found without parsing it (no recursion, linear time, C-speed passes).

A JSON decoder recurses once per level of nesting; a record nested 100,000 levels deep makes it raise
``RecursionError`` (or, in a decoder without a guard, crash). The codec asks this module first, so that
such a record is refused with a reason before any recursive work is done on it.
"""

from __future__ import annotations

import numpy as np

_KEEP = b'[]{}"'
_NOT_KEPT = bytes(b for b in range(256) if b not in _KEEP)
# per byte of the kept text: +1 opens, -1 closes, 0 for a quote
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def may_exceed(value: bytes, limit: int) -> bool:
    """Cheap pre-check: False when ``value`` cannot nest deeper than ``limit`` (it has no more opening
    brackets than that, counting those inside strings too). Two ``bytes.count`` calls."""
    return value.count(b"[") + value.count(b"{") > limit


def nesting_depth(value: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (``{"a": [1]}`` is 2; a scalar is 0).

    Brackets inside strings do not count. Exact for valid JSON; for invalid JSON it is some number the
    caller may compare with a limit (a decoder rejects the text anyway).

    How: escapes go first, left to right as a decoder reads them (escaped backslashes, then escaped
    quotes), so every quote left opens or closes a string. Then only quotes and brackets are kept, and a
    bracket counts where an even number of quotes precede it. Each step is one linear pass in C.
    """
    text = value.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = text.translate(None, _NOT_KEPT)
    if not kept:
        return 0
    codes = np.frombuffer(kept, dtype=np.uint8)  # (num_kept,)
    steps = _STEP[codes]
    inside = np.cumsum(codes == ord('"'), dtype=np.int32) & 1  # 1 within a string (after its opening quote)
    steps[inside.astype(bool)] = 0
    return max(0, int(np.cumsum(steps, dtype=np.int32).max()))
