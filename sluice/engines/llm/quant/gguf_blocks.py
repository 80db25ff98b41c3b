"""The block layouts of GGUF quantised rows that the CPU kernels can take over, and dequantisation.

Raw rows are ``(rows, row_bytes)`` uint8 tensors: a GGUF quantised matrix ``(rows, cols)`` is stored row by
row, each row a run of blocks along ``cols`` (32 or 256 values per block).

:func:`affine_int4` unpacks the 4-bit formats whose every group of 32 values is ``w = q * scale + offset``
with ``q`` in ``0..15``: that is the form of torch's int4 CPU layout, so these repack without
re-quantisation. Formats (ggml's ``block_q4_0``, ``block_q4_1``, ``block_q4_K``):

* ``Q4_0`` (18 bytes / 32 values): fp16 ``d``, 16 bytes of nibbles; ``w = (q - 8) * d``.
* ``Q4_1`` (20 bytes / 32): fp16 ``d``, fp16 ``m``, 16 bytes; ``w = q * d + m``.
* ``Q4_K`` (144 bytes / 256): fp16 ``d``, fp16 ``dmin``, 12 bytes of eight 6-bit (scale, min) pairs, 128
  bytes of nibbles in four 64-value chunks (low nibbles: the chunk's first 32 values, high: the next 32);
  group ``g`` is ``w = d * sc[g] * q - dmin * m[g]`` (the products in fp32, as ggml computes them).

Nibble order inside a 32-value block of Q4_0/Q4_1: byte ``j`` holds value ``j`` (low) and ``j + 16`` (high).

:func:`dequantize` also reads ``Q8_0`` and ``Q6_K`` with torch ops -- the types llama.cpp's quantiser gives
the output matrix and a tied embedding table, whose rows a rescored LM head and an embedding lookup read
every step (faster than the ``gguf`` package's numpy code on those few rows):

* ``Q6_K`` (210 bytes / 256): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one
  per 16 values), fp16 ``d``; in each half of 128 values, low nibbles of bytes 0-63 then their high nibbles
  give the low 4 bits, the 32 ``qh`` bytes shifted by 0, 2, 4, 6 the top 2 bits of the four 32-value runs;
  ``w = (d * sc) * (q - 32)`` in fp32, as the ``gguf`` package computes it.

The ``gguf`` package's dequantisers are the independent reference the tests check these against.
"""

from __future__ import annotations

import numpy as np
import torch

# ggml type ids (gguf.GGMLQuantizationType) of the formats handled here
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K = 2, 3, 8, 12, 14
INT4_EXACT_TYPES = frozenset({Q4_0, Q4_1, Q4_K})
GROUP = 32  # values per (scale, offset) group of every 4-bit format above and Q8_0
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34, Q4_K: 144, Q6_K: 210}
_BLOCK_VALUES = {Q4_0: 32, Q4_1: 32, Q8_0: 32, Q4_K: 256, Q6_K: 256}
_Q6_K_HIGH_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)


def _blocks(tensor_type: int, data: torch.Tensor) -> torch.Tensor:
    """``(rows, num_blocks, block_bytes)`` uint8 view of raw rows ``(rows, row_bytes)``."""
    return data.reshape(data.shape[0], -1, _BLOCK_BYTES[tensor_type])


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """``(..., 2)`` uint8 little-endian halves -> ``(...)`` float32."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``(..., 16)`` bytes -> ``(..., 32)`` values: low nibbles first, then high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def affine_int4(tensor_type: int, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, scale, offset)`` of raw Q4_0 / Q4_1 / Q4_K rows ``(rows, row_bytes)``: ``q`` ``(rows, cols)`` uint8
    in ``0..15``, ``scale`` and ``offset`` ``(rows, cols // 32)`` float32, ``w = q * scale + offset`` per group."""
    kind = tensor_type
    b = _blocks(kind, data)
    n = b.shape[0]
    if kind == Q4_0:
        d = _fp16(b[..., 0:2])
        q = _nibbles(b[..., 2:18])
        return q.reshape(n, -1), d, -8.0 * d
    if kind == Q4_1:
        d, m = _fp16(b[..., 0:2]), _fp16(b[..., 2:4])
        q = _nibbles(b[..., 4:20])
        return q.reshape(n, -1), d, m
    if kind == Q4_K:
        d, dmin = _fp16(b[..., 0:2]), _fp16(b[..., 2:4])  # (n, nb)
        sc, mn = _q4_k_scales(b[..., 4:16])  # (n, nb, 8)
        qs = b[..., 16:144].reshape(n, -1, 4, 32)  # four chunks of 64 values
        q = torch.stack([qs & 0x0F, qs >> 4], dim=3)  # (n, nb, 4, 2, 32): group 2c + nibble
        scale = d.unsqueeze(-1) * sc.float()
        offset = -(dmin.unsqueeze(-1) * mn.float())
        return q.reshape(n, -1), scale.reshape(n, -1), offset.reshape(n, -1)
    raise ValueError(f"GGUF type {kind} is not a 4-bit affine format")


def _q4_k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight 6-bit scales and mins from the 12 scale bytes ``(..., 12)`` of a Q4_K block."""
    d, m, m_d = raw[..., 0:4], raw[..., 4:8], raw[..., 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def dequantize(tensor_type: int, data: torch.Tensor, cols: int) -> torch.Tensor:
    """Raw rows ``(rows, row_bytes)`` of any GGUF type as float32 ``(rows, cols)``: the formats above with
    torch ops, any other type with the ``gguf`` package's dequantiser."""
    n = int(data.shape[0])
    if tensor_type == Q8_0:
        q, d = q8_0_blocks(data)
        return (q.view(n, -1, GROUP).float() * d.unsqueeze(-1)).view(n, cols)
    if tensor_type in INT4_EXACT_TYPES:
        q, scale, offset = affine_int4(tensor_type, data)
        return (q.view(n, -1, GROUP).float() * scale.unsqueeze(-1) + offset.unsqueeze(-1)).view(n, cols)
    if tensor_type == Q6_K:
        return _q6_k(data).view(n, cols)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    values = gguf_dequantize(np.ascontiguousarray(data.numpy()), GGMLQuantizationType(tensor_type))
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(n, cols))


def q8_0_blocks(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, d)`` of Q8_0 rows ``(rows, row_bytes)``: ``q`` ``(rows, cols)`` int8, ``d`` ``(rows, cols // 32)``
    float32, ``w = q * d`` per group."""
    b = _blocks(Q8_0, data)
    d = _fp16(b[..., 0:2])
    q = b[..., 2:34].contiguous().view(torch.int8)
    return q.reshape(data.shape[0], -1), d


def _q6_k(data: torch.Tensor) -> torch.Tensor:
    """Q6_K rows ``(rows, row_bytes)`` as float32 ``(rows, num_blocks, 16, 16)``: 16 runs of 16 values, each
    with its scale (the layout in the module docstring)."""
    b = _blocks(Q6_K, data)
    n, nb = b.shape[0], b.shape[1]
    ql = b[..., 0:128].reshape(n, nb, 2, 1, 64)  # per half: 64 bytes, low then high nibbles
    low = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(n, nb, 2, 4, 32)
    high = (b[..., 128:192].reshape(n, nb, 2, 1, 32) >> _Q6_K_HIGH_SHIFTS) & 0x03  # (n, nb, 2, 4, 32)
    q = (low | (high << 4)).to(torch.float32).sub_(32.0).view(n, nb, 16, 16)
    scales = b[..., 192:208].contiguous().view(torch.int8).float()  # (n, nb, 16)
    d = _fp16(b[..., 208:210])  # (n, nb)
    return (d.unsqueeze(-1) * scales).unsqueeze(-1) * q
