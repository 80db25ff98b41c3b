"""Triton kernel for a mixture-of-experts layer's experts: one grouped matmul over rows sorted by expert.

A layer with ``k`` experts per token has ``tokens * k`` output rows (token-major: row ``r`` is token
``r // k``'s ``r % k``-th choice, of expert ``ids[r]``). :func:`align_by_expert` sorts the rows by expert
and pads each expert's group to a multiple of ``BLOCK_M`` with a sentinel row (``num_rows``), so that every
block of ``BLOCK_M`` rows belongs to one expert; the kernel then computes, per block and ``BLOCK_N`` tile of
outputs, ``a[rows // rows_per_input] @ w[expert]`` over ``BLOCK_K`` slices of the inputs, accumulated in fp32,
and writes each valid row to its token-major place (sentinels are masked). The same kernel serves both
projections: gate/up reads each token's row ``k`` times (``rows_per_input = k``), down reads the gate/up
product row by row (``rows_per_input = 1``). Experts that no token chose cost nothing.

Contract (:func:`grouped_matmul`), as :func:`reference_grouped_matmul`: ``out[r] = a[r // rows_per_input] @
w[ids[r]]``, ``w`` stacked ``(experts, in, out)``; result in ``a``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _grouped_matmul_kernel(
    a_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr,
    num_rows, n, k, rows_per_input,
    a_stride_m, w_stride_e, w_stride_k, out_stride_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    block = tl.program_id(0)
    tile = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    rows = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))  # (BLOCK_M,) sentinel = num_rows
    valid = rows < num_rows
    inputs = (rows // rows_per_input).to(tl.int64)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + inputs[:, None] * a_stride_m + ks[None, :], mask=valid[:, None] & (ks[None, :] < k),
                    other=0.0)
        w = tl.load(w_ptr + expert * w_stride_e + ks[:, None] * w_stride_k + cols[None, :],
                    mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    dst = out_ptr + rows.to(tl.int64)[:, None] * out_stride_m + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < n))


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int, static_grid: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(rows, block_experts): the row indices of ``ids`` (``(num_rows,)`` expert of each row) sorted by expert,
    each expert's group padded with ``num_rows`` to a multiple of ``block_m``; and the expert of each block.
    Computed on ``ids``' device without a host synchronisation but for the padded length; with
    ``static_grid``, without any: as many blocks as the rows can need (``num_rows // block_m`` plus one per
    expert that can have rows), the ones past the padded length all sentinels."""
    num_rows = ids.numel()
    order = torch.argsort(ids, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, ids.to(torch.int64), torch.ones_like(ids, dtype=torch.int64))  # bincount reads back
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    start = counts.cumsum(0) - counts
    if static_grid:
        total = (num_rows // block_m + min(num_experts, num_rows)) * block_m
    else:
        total = int(padded_end[-1].item())  # the only value read back: the launch grid needs it
    sorted_ids = ids[order]
    rows = torch.full((total,), num_rows, dtype=torch.int32, device=ids.device)
    place = padded_start[sorted_ids] + torch.arange(num_rows, device=ids.device) - start[sorted_ids]
    rows[place] = order.to(torch.int32)
    # block b is expert e's where e's padded group holds it; blocks past the last group are sentinels
    blocks = torch.arange(total // block_m, device=ids.device)
    block_experts = torch.searchsorted(padded_end // block_m, blocks, right=True).clamp_(max=num_experts - 1)
    return rows, block_experts.to(torch.int32)


def grouped_matmul(
    a: torch.Tensor,  # (num_inputs, in)
    w: torch.Tensor,  # (experts, in, out), the out dim contiguous
    ids: torch.Tensor,  # (num_rows,) expert of each output row
    rows_per_input: int,  # output row r reads input row r // rows_per_input
    block_m: int = 16,
    static_grid: bool = False,  # size the launch from the shapes alone (a CUDA graph can hold it)
) -> torch.Tensor:  # (num_rows, out) in a's dtype
    """``out[r] = a[r // rows_per_input] @ w[ids[r]]`` for every row, one launch (see the module docstring)."""
    num_rows, (num_experts, k, n) = ids.numel(), w.shape
    out = torch.empty(num_rows, n, dtype=a.dtype, device=a.device)
    if num_rows == 0:
        return out
    a, w = a.contiguous(), w.contiguous()
    rows, block_experts = align_by_expert(ids.reshape(-1), num_experts, block_m, static_grid)
    block_n, block_k = 64, 32
    grid = (block_experts.numel(), triton.cdiv(n, block_n))
    _grouped_matmul_kernel[grid](
        a, w, out, rows, block_experts, num_rows, n, k, rows_per_input,
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else None,
    )  # fmt: skip
    return out


def reference_grouped_matmul(a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, rows_per_input: int) -> torch.Tensor:
    """The contract, one row at a time in fp32: what the kernel is checked against."""
    inputs = torch.arange(ids.numel(), device=a.device) // rows_per_input
    return torch.einsum("rk,rkn->rn", a[inputs].float(), w[ids].float()).to(a.dtype)
