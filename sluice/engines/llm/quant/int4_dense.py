"""An int4 weight's matmul as a dense bf16 GEMM: the weight dequantised slice by slice, for many rows at once.

torch's ``_weight_int4pack_mm_for_cpu`` dequantises every weight tile again for each block of four rows and
multiplies in float32; for a prompt's hundreds of rows that is slower than dequantising the weight once
(native ``int4_unpack``, transposed as the packed layout stores it) into a bf16 scratch slice and handing it
to oneDNN's bf16 GEMM. Below a few dozen rows the GEMM is bound by memory (the bf16 slice is 3.5x the packed
bytes, written by the unpack and read again) and loses (``bench/int4_matmul.py``, the ``dense`` column).

Guarantees:

* ``dense_matmul(w, x)`` is ``x @ W.T`` with ``W`` the weight rounded to bf16 (``(q - 8) * scale + zero``
  in float32, then to nearest bf16), accumulated in float32 by the GEMM, returned in bf16. The int4 kernel
  uses the unrounded float32 weight, so the two differ by about one bf16 rounding of each weight (relative
  ~2**-9), well inside int4's own error -- but they differ, which is why the engine routes rows by what
  they are (prompt positions) and never by how many share a step (``model/layers/quantized.py``).
* A row's result does not depend on the other rows of the call: the rows are padded to a multiple of four
  (``model/layers/row_invariant.py``: oneDNN's GEMM sums a single row in another order), and the slicing depends
  on the weight's shape only.
* Memory: one scratch slice of at most ``SLICE_BYTES`` (plus a 64-row tile) per thread that calls it, kept
  for reuse -- a fresh buffer per call would pay its page faults every time.
"""

from __future__ import annotations

import threading

import torch

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.model.layers.row_invariant import padded_rows
from sluice.engines.llm.quant.packed import COMPUTE_DTYPE, Int4Weight

SLICE_BYTES = 8 << 20  # bf16 scratch per slice: rows of the weight dequantised at a time
_TILE = 64  # the packed layout's row tile: slices start on one
_local = threading.local()


def available(x: torch.Tensor) -> bool:
    """Whether ``dense_matmul`` can run for activations ``x`` (a CPU tensor, the native kernels built)."""
    return native_cpu.takes(x)


def _scratch(numel: int) -> torch.Tensor:
    buf: torch.Tensor | None = getattr(_local, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=COMPUTE_DTYPE)
        _local.buf = buf
    return buf[:numel]


def slice_rows(in_features: int) -> int:
    """Rows of the weight dequantised per slice: ``SLICE_BYTES`` of bf16, a whole number of tiles."""
    return max(_TILE, SLICE_BYTES // (2 * in_features) // _TILE * _TILE)


def dense_matmul(weight: Int4Weight, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for ``x`` ``(rows, in_features)`` through bf16 slices of ``W``; ``(rows, out_features)``
    bf16. Call only where :func:`available`."""
    x = x.to(COMPUTE_DTYPE).contiguous()
    rows = x.shape[0]
    if padded_rows(rows) != rows:
        x = torch.cat([x, x.new_zeros(padded_rows(rows) - rows, x.shape[1])])
    k, n_out, padded = weight.in_features, weight.out_features, weight.packed.shape[0]
    step = slice_rows(k)
    y = torch.empty(x.shape[0], n_out, dtype=COMPUTE_DTYPE) if n_out > step else None
    for start in range(0, n_out, step):
        stop = min(start + step, padded)  # a slice reaching the padding rows unpacks them too (whole tiles)
        w_t = _scratch(k * (stop - start)).view(k, stop - start)  # W[start:stop].T: the packed layout's order
        native_cpu.int4_unpack(weight.packed, weight.scale_zero, start, w_t)
        part = torch.mm(x, w_t[:, : min(stop, n_out) - start])
        if y is None:
            y = part
        else:
            y[:, start : start + part.shape[1]] = part
    assert y is not None
    return y[:rows]
