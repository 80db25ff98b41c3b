"""The int8 rewrite's weights: symmetric int8 per output column, within the range this CPU's integer GEMM
keeps exact (:func:`weight_qmax`)."""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

import numpy as np

QMAX = 127.0


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(wq int8 (K, N), ws float32 (N,))`` with ``w ~= wq * ws``: symmetric, one scale per column, within
    :func:`weight_qmax` steps."""
    qmax = weight_qmax()
    amax = np.abs(w).max(axis=0)
    ws = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    return np.clip(np.rint(w / ws), -qmax, qmax).astype(np.int8), ws


@functools.cache
def weight_qmax() -> float:
    """127; or 63 on an x86 CPU without VNNI (AVX512-VNNI or AVX-VNNI), where ONNX Runtime's uint8 x int8
    kernel adds pairs of products in int16 (``vpmaddubsw``): 2 x 255 x 63 = 32130 fits, 2 x 255 x 127 does
    not and saturates. Other CPUs (ARM's dot products) take the full range."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return QMAX
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return 63.0  # unknown x86: the range that is exact everywhere
    return QMAX if re.search(r"\b(avx512_vnni|avx_vnni)\b", flags) else 63.0
