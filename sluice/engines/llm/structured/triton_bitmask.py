"""Triton kernel: apply packed token bitmasks to logits rows in place (the CUDA path of ``bitmask.py``).

Grid ``(num_masked_rows, cdiv(vocab, BLOCK))``: each program loads the int32 words covering ``BLOCK``
vocabulary columns of one mask, expands each word to its 32 bits, and stores ``-inf`` into the logits row
``rows[i]`` where a bit is clear. Only plain loads of the row index and the words (no pointer chasing), so
it also runs under ``TRITON_INTERPRET=1``. Columns past the mask's words are disallowed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 2048  # vocabulary columns per program: 64 words of the mask


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,  # (num_rows, vocab) float
    bitmask_ptr,  # (num_masked_rows, num_words) int32
    rows_ptr,  # (num_masked_rows,) int64: logits row of each mask
    vocab,
    num_words,
    logits_row_stride,
    logits_col_stride,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    block = tl.program_id(1)
    row = tl.load(rows_ptr + i)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(bitmask_ptr + i * num_words + cols // 32, mask=(cols < vocab) & (cols // 32 < num_words),
                    other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * logits_row_stride + cols * logits_col_stride, float("-inf"),
             mask=(cols < vocab) & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """``logits`` (num_rows, vocab), any strides; ``bitmask`` (num_masked_rows, num_words) int32 and
    ``rows`` (num_masked_rows,) int64 on the same device."""
    bitmask = bitmask.contiguous()
    num_masked, num_words = bitmask.shape
    vocab = logits.shape[1]
    grid = (num_masked, triton.cdiv(vocab, _BLOCK))
    _apply_bitmask_kernel[grid](logits, bitmask, rows.to(torch.int64), vocab, num_words, logits.stride(0),
                                logits.stride(1), BLOCK=_BLOCK)
