"""Dense matmuls whose rows do not depend on the rest of the call: the CPU half of batch invariance.

A BLAS GEMM gives row ``i`` of ``x @ W.T`` the same bits whatever the other rows are only while it takes the
same kernel for it, and the kernel is chosen by shape: on x86 MKL's float32 GEMM sums a call of one to three
rows (a GEMV-like path) in another order than a call of more, and with several threads it splits the rows
into runs whose short tail takes that path too; oneDNN's bf16 GEMM has a one-row path of its own. So the
same prompt decoded alone (one row a step) and beside fifteen others (sixteen rows) would get different
logits, and greedy answers that flip where two tokens are nearly tied.

:func:`row_invariant_rows` pads a call's rows with zeros up to a multiple of four, the shapes at which every
row takes the main kernel whatever the thread count (``tests/engines/llm/layers/test_row_invariant.py`` walks
row counts, offsets and thread counts on the machine it runs on). That costs little where rows are many; at
one to three rows the main kernel is slower than the GEMV path (float32 weights decoding one request at a
time: ``deterministic: false`` in the engine's options gives that speed back, and the batch dependence).

Guarantee: for a given weight, dtype, CPU and torch build, ``RowInvariantLinear(x)[i]`` is a function of
``x[i]`` alone -- not of the number of rows, the row's place among them, or ``torch.get_num_threads()``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ROW_UNIT = 4  # MKL's float32 kernel takes rows in fours; a shorter run sums in another order


def padded_rows(num_rows: int) -> int:
    """The row count a call of ``num_rows`` is padded to: the next multiple of ``ROW_UNIT``."""
    return max(ROW_UNIT, -(-num_rows // ROW_UNIT) * ROW_UNIT)


def row_invariant_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn`` (a matmul by a fixed weight), called on ``x``'s rows padded with zeros
    to :func:`padded_rows`; the padding's results are dropped. ``x``: ``(rows, features)``."""
    rows = x.shape[0]
    target = padded_rows(rows)
    if rows == target:
        return fn(x)
    padded = x.new_zeros(target, x.shape[1])
    padded[:rows] = x
    return fn(padded)[:rows]


class RowInvariantLinear(nn.Linear):
    """``nn.Linear`` whose rows are computed as in a large call (see the module docstring); CPU only. Swapped
    in for the model's dense linear layers by :func:`make_row_invariant`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        return row_invariant_rows(lambda rows: F.linear(rows, self.weight, self.bias), x)


def make_row_invariant(model: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` under ``model`` into a :class:`RowInvariantLinear` in place (the same
    parameters), and have its bf16 packed weights pad their rows too; returns how many layers changed. Call
    on a CPU model only."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowInvariantLinear
            count += 1
        elif hasattr(getattr(module, "packed", None), "row_invariant"):  # a DenseWeight (quant/packed.py)
            module.packed.row_invariant = True  # type: ignore[union-attr]
            count += 1
    return count
