"""Weights kept packed on the CPU: dense bf16, int8 per output channel, int4 per group of 32 input values.

Every :class:`PackedWeight` stands for a matrix ``W`` ``(out_features, in_features)`` and offers:

* ``matmul(x)``: ``x @ W.T`` for ``x`` ``(num_rows, in_features)`` of any float dtype, returned in bf16. The
  CPU kernels (torch's ``_weight_int4pack_mm_for_cpu`` / ``_weight_int8pack_mm`` and oneDNN's bf16 GEMM) are
  fast only with bf16 activations -- with float32 or float16 ones torch falls back to scalar loops many
  times slower -- so ``x`` goes in as bf16 and the result (accumulated in fp32 inside the kernel) comes out rounded
  to bf16. Int4 weights use Sluice's own kernel on the same layout where it is built (a CPU with AVX512-BF16:
  ``cpu/native/int4_matmul.cpp``, faster: ``bench/int4_matmul.py``), with the same bf16 activations and output. That rounding (8 significant bits) is the price of these modes against ``weights: fp32``. The
  result stays bf16: the next matmul takes it as it is, and torch's type promotion lifts it into a float32
  residual stream without a separate conversion.
* ``rows(ids)``: rows of ``W`` as float32, for embeddings that share the LM head's matrix.
* ``nbytes``: the memory it holds.

Layouts:

* :class:`Int4Weight`: ``w = (q - 8) * scale + zero`` per group of 32 along ``in_features``, ``q`` in
  ``0..15``; torch's packed CPU layout ``(N, K / 2)`` uint8 (rows interleaved in tiles of 64, which is why
  rows are packed in chunks of a multiple of 64), ``scale_zero`` ``(K / 32, N, 2)`` bf16. From a GGUF Q4
  tensor it is the same ``q`` with ``scale = d`` and ``zero = offset + 8 * d`` (:func:`~.gguf_blocks.affine_int4`),
  so only the scales and zero points are rounded (to bf16); from floats, each group's min and max map to
  ``q = 0`` and ``q = 15`` (asymmetric), or, for a head that only ranks (``symmetric``), ``q - 8`` spans
  ``-8..7`` of one scale. Where every zero point is 0 (a Q4_0 tensor: ``w = (q - 8) * d``; a symmetric
  head) and Sluice's kernel runs, ``scale_zero`` keeps the scales only, ``(K / 32, N, 1)``: the kernel then
  reads 18 bytes per 32 weights instead of 20, and its results are the same bit for bit.
* :class:`Int8Weight`: ``w = q * scale[row]``, ``q`` in ``-127..127``, ``scale`` bf16, at least
  ``absmax / 127`` so that no value clips; symmetric.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.model.layers.row_invariant import row_invariant_rows
from sluice.engines.llm.quant.gguf_blocks import GROUP, affine_int4
from sluice.engines.llm.quant.gguf_rows import GGUFRows

COMPUTE_DTYPE = torch.bfloat16  # what the packed CPU kernels take as activations, scales and zero points
# Rows converted at a time: bounds the int32 / float32 temporaries of a large matrix. The int4 layout packs
# tiles of 64 rows together, so chunks must be a multiple of 64 for their packings to concatenate.
_PACK_ROWS = 4096
_ROW_TILE = 16  # the int4 layout needs a multiple of this many rows


class PackedWeight(Protocol):
    out_features: int
    in_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # (M, in) any float dtype -> (M, out) bf16
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # (*ids.shape, in) float32
        ...

    @property
    def nbytes(self) -> int: ...


def default_scales_only() -> bool:
    """Whether int4 weights whose zero points are all 0 keep their scales only, unless told: where Sluice's
    int4 kernel is built (torch's takes pairs). The engine says it from its plan (``kernels.int4_scales_only``)."""
    return native_cpu.int4_matmul_available()


def row_chunks(source: torch.Tensor | GGUFRows) -> Iterator[torch.Tensor]:
    """``source`` as float32 chunks of ``_PACK_ROWS`` rows: no float32 copy of a whole matrix is ever held."""
    for start in range(0, source.shape[0], _PACK_ROWS):
        if isinstance(source, GGUFRows):
            yield source.to_float(start, start + _PACK_ROWS)
        else:
            yield source[start : start + _PACK_ROWS].float()


def _to_compute(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == COMPUTE_DTYPE else x.to(COMPUTE_DTYPE)


class DenseWeight:
    """``W`` stored in bf16 (``weights: bf16``, or a GGUF F16/BF16 tensor under ``weights: auto``)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight  # (N, K) bf16
        self.out_features, self.in_features = self.weight.shape
        self.row_invariant = False  # set by model/layers/row_invariant.py: rows padded as that module says

    @classmethod
    def convert(cls, source: torch.Tensor | GGUFRows) -> DenseWeight:
        return cls(torch.cat([chunk.to(COMPUTE_DTYPE) for chunk in row_chunks(source)]))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if not self.row_invariant:
            return torch.matmul(_to_compute(x), self.weight.T)
        return row_invariant_rows(lambda rows: torch.matmul(rows, self.weight.T), _to_compute(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.weight).float()

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class Int8Weight:
    """``W = q * scale[row]``; see the module docstring."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        self.q = q  # (N, K) int8
        self.scale = scale  # (N,) bf16
        self.out_features, self.in_features = q.shape

    @classmethod
    def quantize(cls, source: torch.Tensor | GGUFRows) -> Int8Weight:
        """Symmetric per-row int8 of a float matrix or a GGUF tensor of any type (its values re-quantised)."""
        qs, scales = [], []
        for chunk in row_chunks(source):  # (rows, K) float32
            # bf16 (the kernel's scale dtype) rounds to nearest; aiming 2^-8 high keeps it >= absmax / 127,
            # so no value clips
            scale = (chunk.abs().amax(dim=1) * ((1 + 2**-8) / 127.0)).to(COMPUTE_DTYPE)
            safe = torch.where(scale > 0, scale.float(), torch.ones(scale.shape))
            qs.append(torch.round(chunk / safe.unsqueeze(1)).clamp_(-127, 127).to(torch.int8))
            scales.append(scale)
        return cls(torch.cat(qs), torch.cat(scales))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(_to_compute(x), self.q, self.scale)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids].float().unsqueeze(-1)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 2


class Int4Weight:
    """``W = (q - 8) * scale + zero`` per group of 32 input values; see the module docstring."""

    group_size = GROUP

    def __init__(self, packed: torch.Tensor, scale_zero: torch.Tensor, out_features: int) -> None:
        self.packed = packed  # (N_padded, K / 2) uint8, torch's CPU int4 layout
        self.scale_zero = scale_zero  # (K / 32, N_padded, 2) bf16, or (K / 32, N_padded, 1): zero points all 0
        self.out_features = out_features
        self.in_features = packed.shape[1] * 2
        # Sluice's int4 kernel (cpu/native/int4_matmul.cpp) or torch's: the engine sets it from its plan
        # (kernels.int4_matmul); left None, the first matmul asks what the machine has (building the kernels)
        self.native: bool | None = None

    @staticmethod
    def supports(shape: tuple[int, int]) -> bool:
        """Whether a ``(N, K)`` matrix fits the kernel (K a multiple of the group size)."""
        return shape[1] % GROUP == 0

    @classmethod
    def from_affine(cls, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                    scales_only: bool | None = None) -> Int4Weight:  # fmt: skip
        """``w = q * scale + offset`` per group (``q`` ``(N, K)`` in 0..15, the others ``(N, K / 32)``).
        ``scales_only`` (here and below): keep only the scales where every zero point is 0 (None:
        :func:`default_scales_only`)."""
        return cls._pack([(q, scale, offset)], q.shape[0], q.shape[1], scales_only)

    @classmethod
    def from_gguf(cls, rows: GGUFRows, scales_only: bool | None = None) -> Int4Weight:
        """Repack a Q4_0 / Q4_1 / Q4_K tensor (its quants as they are), chunk by chunk."""
        parts = (affine_int4(rows.tensor_type, rows.read(start, min(start + _PACK_ROWS, rows.num_rows)))
                 for start in range(0, rows.num_rows, _PACK_ROWS))  # fmt: skip
        return cls._pack(parts, rows.num_rows, rows.shape[1], scales_only)

    @classmethod
    def quantize(cls, source: torch.Tensor | GGUFRows, symmetric: bool = False,
                 scales_only: bool | None = None) -> Int4Weight:  # fmt: skip
        """Int4 of a float matrix (or a GGUF tensor's values). Asymmetric: each group's [min, max] onto
        0..15, as GGUF's Q4_1 does. ``symmetric``: ``q - 8`` in -8..7 times one scale per group, no zero point,
        as Q4_0 does -- a step about 7 % coarser for a tenth fewer bytes read (for an LM head that ranks).
        Symmetric is asymmetric where scales-only weights are not kept."""
        scales_only = default_scales_only() if scales_only is None else scales_only
        symmetric = symmetric and scales_only

        def parts() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            for chunk in row_chunks(source):
                g = chunk.reshape(chunk.shape[0], -1, GROUP)
                if symmetric:  # the scale that fits both ends: min onto -8, max onto 7
                    scale = torch.maximum(g.amin(dim=-1) / -8.0, g.amax(dim=-1) / 7.0).clamp_(min=0)
                    lo = -8.0 * scale
                else:
                    lo = g.amin(dim=-1)
                    scale = (g.amax(dim=-1) - lo) / 15.0
                safe = torch.where(scale > 0, scale, torch.ones_like(scale))
                q = torch.round((g - lo.unsqueeze(-1)) / safe.unsqueeze(-1)).clamp_(0, 15).to(torch.uint8)
                yield q.reshape(g.shape[0], -1), scale, lo

        return cls._pack(parts(), source.shape[0], source.shape[1], scales_only)

    @classmethod
    def _pack(cls, parts: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], num_rows: int,
              in_features: int, scales_only: bool | None) -> Int4Weight:  # fmt: skip
        """Pack ``(q, scale, offset)`` row chunks (each a multiple of 64 rows but the last: _PACK_ROWS) into
        buffers of the final size, one chunk at a time: nothing but the result and one chunk's temporaries is
        ever held (collecting the chunks and joining them once held the matrix about three times over)."""
        padded = num_rows + (-num_rows % _ROW_TILE)
        packed = torch.empty(padded, in_features // 2, dtype=torch.uint8)
        scale_zero = torch.empty(in_features // GROUP, padded, 2, dtype=COMPUTE_DTYPE)
        row = 0
        for q, scale, offset in parts:
            n = q.shape[0]
            pad = -n % _ROW_TILE
            qi = q.to(torch.int32)
            if pad:  # the layout needs whole row tiles: zero rows, sliced off after the matmul
                qi = torch.cat([qi, torch.zeros(pad, q.shape[1], dtype=torch.int32)])
                scale = torch.cat([scale, torch.zeros(pad, scale.shape[1])])
                offset = torch.cat([offset, torch.zeros(pad, offset.shape[1])])
            packed[row : row + n + pad] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qi, 1)
            scale_zero[:, row : row + n + pad, 0] = scale.T
            scale_zero[:, row : row + n + pad, 1] = (offset + 8.0 * scale).T
            row += n + pad
        if row != padded:
            raise ValueError(f"packed {row} rows of {padded}: the chunks do not add up to the matrix")
        if scales_only is None:
            scales_only = default_scales_only()
        if scales_only and not scale_zero[..., 1].any():  # every zero point 0: keep the scales only
            scale_zero = scale_zero[..., :1].contiguous()
        return cls(packed, scale_zero, num_rows)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is None:
            self.native = native_cpu.int4_matmul_available()
        if self.native:  # the same layout, faster (cpu/native/int4_matmul.cpp)
            y = native_cpu.int4_matmul(_to_compute(x).contiguous(), self.packed, self.scale_zero)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(_to_compute(x), self.packed, GROUP, self.pairs())
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def pairs(self) -> torch.Tensor:
        """``scale_zero`` as torch's kernel takes it, ``(K / 32, N_padded, 2)``: zero points of 0 added where
        only the scales are kept (a copy per call: only where Sluice's kernel was turned off after loading)."""
        if self.scale_zero.shape[2] == 2:
            return self.scale_zero
        return torch.cat([self.scale_zero, torch.zeros_like(self.scale_zero)], dim=2)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("int4 weights are not gathered; embeddings keep their own copy")

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale_zero.numel() * 2
