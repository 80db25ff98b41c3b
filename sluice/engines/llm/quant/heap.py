"""Handing freed heap memory back to the system while weights are converted.

Converting a checkpoint allocates and frees temporaries of every size (float32 chunks, int32 nibbles, a
chunk's packing before it is copied into place). glibc's allocator keeps most freed memory for reuse
rather than returning it, and its growing mmap threshold sends temporaries of up to 32 MB to the heap after
the first large free -- so the resident size creeps above what the live weights need, and the peak (what a
container's memory limit sees) with it. :func:`release_freed_memory` after each matrix returns that slack
(``malloc_trim``), which lowers the peak resident size of a converted model noticeably (``bench/llm_weights.py``
reports peak RSS). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free memory to the system; whether there was a way to ask (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
