"""torch's packed int4 CPU layout, as the torch in this process writes it.

torch packs an int4 weight for its CPU kernel (``_convert_weight_to_int4pack_for_cpu``) in blocks of four
float vectors' worth of rows -- 64 under AVX512, 32 under AVX2 or without vectors -- and orders a block's
nibbles for the instructions that will read them. So the layout belongs to the machine (and to
``ATEN_CPU_CAPABILITY``), not to the model file, and Sluice's kernels that read packed bytes themselves
(native ``int4_unpack``; ``int4_matmul``, written for the AVX512 layout) must read the one torch wrote here.

:func:`torch_layout` finds it once per process by packing a probe with torch and comparing the bytes with
each layout :func:`pack` knows; a torch that packs some other way is refused in one line rather than read
wrongly. Guarantee: ``pack(q, torch_layout())`` equals torch's packing of ``q`` for every ``q`` whose row
count is a multiple of 16 (the probe covers whole blocks and every tail size).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Int4Layout:
    """Blocks of ``block`` rows; in a whole block with ``halves``, byte j of each k holds row j (low nibble)
    and row j + block / 2 (high); otherwise -- and in the rows past the last whole block -- rows 2 j and
    2 j + 1."""

    block: int
    halves: bool


AVX512 = Int4Layout(64, True)
AVX2 = Int4Layout(32, True)
PAIRS = Int4Layout(32, False)  # torch's kernels without vector instructions
KNOWN = (AVX512, AVX2, PAIRS)


def pack(q: torch.Tensor, layout: Int4Layout) -> torch.Tensor:
    """``q`` ``(N, K)`` (values 0..15, N a multiple of 16) packed as ``layout`` lays it out: ``(N, K / 2)``
    uint8. The reference the native unpack and torch's packing are checked against."""
    n, k = q.shape
    q = q.to(torch.uint8)
    flat = torch.empty(n * k // 2, dtype=torch.uint8)
    for b0 in range(0, n, layout.block):
        rows = q[b0 : b0 + layout.block]
        if rows.shape[0] == layout.block and layout.halves:
            low, high = rows[: layout.block // 2], rows[layout.block // 2 :]
        else:
            low, high = rows[0::2], rows[1::2]
        flat[b0 * k // 2 : (b0 + rows.shape[0]) * k // 2] = (low | (high << 4)).T.reshape(-1)
    return flat.view(n, k // 2)


@functools.cache
def torch_layout() -> Int4Layout:
    """The layout this process's torch packs int4 CPU weights in. Raises RuntimeError for one it does not
    know."""
    probe = torch.randint(0, 16, (112, 32), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)  # 112 rows: whole blocks and a tail
    for layout in KNOWN:
        if torch.equal(packed, pack(probe, layout)):
            return layout
    raise RuntimeError(f"torch {torch.__version__} packs int4 CPU weights in a layout Sluice does not know (CPU "
                       f"capability {torch.backends.cpu.get_cpu_capability()}); load the model with "
                       "weights: bf16 or fp32 instead")
