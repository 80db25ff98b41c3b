"""Dense matmuls whose rows do not depend on the rest of the call: the CPU half of batch invariance.

A BLAS GEMM gives row ``i`` of ``x @ W.T`` the same bits whatever the other rows are only while it takes the
same kernel for it, and the kernel is chosen by shape: on x86 MKL's float32 GEMM sums a call of one to three
rows (a GEMV-like path) in another order than a call of more, and with several threads it splits the rows
into runs whose short tail takes that path too; oneDNN's bf16 GEMM has a one-row path of its own. So the
same prompt decoded alone (one row a step) and beside fifteen others (sixteen rows) would get different
logits, and greedy answers that flip where two tokens are nearly tied.

:func:`row_invariant_rows` pads a call's rows with zeros up to a multiple of four, the shapes at which every
row takes the main kernel whatever the thread count (``tests/engines/llm/layers/test_row_invariant.py`` walks
row counts, offsets and thread counts on the machine it runs on). Float32 weights are prepacked for oneDNN's
matmul, which pads cheaply: with MKL's GEMM the padded one-row call cost float32 decoding a third of its
speed, with oneDNN's it is faster than MKL's own one-row path (``bench/results/llm_batch_invariance.md``).

Guarantee: for a given weight, dtype, CPU and torch build, ``RowInvariantLinear(x)[i]`` is a function of
``x[i]`` alone -- not of the number of rows, the row's place among them, or ``torch.get_num_threads()``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.kernels import graph_ops

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
    in for the model's dense linear layers by :func:`make_row_invariant`.

    A float32 weight is prepacked once for oneDNN's matmul (``onednn_weight``) where torch has it: row-invariant
    under the same padding, and faster than MKL's GEMM at every row count measured here (one row: about as fast
    as MKL's one-row path; hundreds: over twice as fast). The dense weight is then dropped unless another module
    shares it (a tied embedding)."""

    onednn_weight: torch.Tensor | None = None
    pad_rows = True  # False (deterministic: false): the call's own rows, whichever kernel that picks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        packed = self.onednn_weight
        if packed is not None and graph_ops.compiling():  # the same oneDNN call, opaque to the compiler
            def matmul(rows: torch.Tensor) -> torch.Tensor:
                return graph_ops.onednn_linear(rows, packed, self.bias, self.out_features)
        elif packed is not None:
            def matmul(rows: torch.Tensor) -> torch.Tensor:
                return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, self.bias, "none", [], "")
        else:
            def matmul(rows: torch.Tensor) -> torch.Tensor:
                return F.linear(rows, self.weight, self.bias)
        y = row_invariant_rows(matmul, flat) if self.pad_rows else matmul(flat)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def _onednn_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` prepacked for oneDNN's float32 matmul, or None where torch cannot (no oneDNN, another dtype)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROW_UNIT)
    except (AttributeError, RuntimeError):
        return None
    return packed


def make_row_invariant(model: nn.Module, pad_rows: bool = True) -> int:
    """Turn every plain ``nn.Linear`` under ``model`` into a :class:`RowInvariantLinear` in place (the same
    parameters, float32 ones prepacked for oneDNN), and have its bf16 packed weights pad their rows too;
    returns how many layers changed. Call on a CPU model only. ``pad_rows=False`` (``deterministic: false``)
    keeps the prepacked matmuls but not the padding: each call's own row count picks the kernel."""
    uses: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            uses[id(param)] = uses.get(id(param), 0) + 1
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowInvariantLinear
            module.pad_rows = pad_rows  # type: ignore[assignment]
            packed = _onednn_weight(module.weight)
            if packed is not None:
                module.onednn_weight = packed
                if uses[id(module.weight)] == 1:  # no one else reads it: keep one copy of the weights
                    module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)
            count += 1
        elif hasattr(getattr(module, "packed", None), "row_invariant"):  # a DenseWeight (quant/packed.py)
            module.packed.row_invariant = pad_rows  # type: ignore[union-attr]
            count += 1
    return count
