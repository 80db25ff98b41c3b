"""CPU attention for sequences with a few new tokens (2..``MAX_BATCHED_QUERY_LEN``: speculative verifies of
``1 + k`` tokens): planned once per step by :func:`~sluice.engines.llm.model.attention.plan_cpu_attention`,
attended in one batched call per layer, each sequence's queries padded to the longest of them. Same
semantics as :mod:`sluice.engines.llm.model.attention` (causal, sliding window, soft-cap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.engines.llm.kernels.torch_ops import attend, sinks_by_row

MAX_BATCHED_QUERY_LEN = 8  # sequences with 2..this many new tokens share one attention call per layer


@dataclass(slots=True)
class ShortQueryPlan:
    """``n`` sequences of 2..``width`` new tokens each, attended in one call (CPU path).

    Query row ``j`` of a sequence becomes ``group`` rows ``j * group .. j * group + group - 1`` of its KV
    head's attention problem; rows of a sequence shorter than ``width`` are padding (they repeat its last
    row and their outputs are dropped).
    """

    width: int  # query rows per sequence after padding
    rows: torch.Tensor  # (n * width,) int64 flat query rows, padding repeats a row
    blocks: torch.Tensor  # (n * max_blocks,) int64, padded with block 0
    masks: dict[int | None, torch.Tensor]  # per window: (n, 1, width * group, max_blocks * block_size) bool
    valid: torch.Tensor | None  # (num_rows,) int64 unpadded entries of ``rows``; None = all
    out_rows: torch.Tensor  # (num_rows,) int64 flat rows the valid outputs go to


def plan_short_queries(
    short: list[tuple[int, int, int, int]], block_tables: list[list[int]], block_size: int, group: int,
    windows: list[int | None],
) -> ShortQueryPlan:  # fmt: skip
    width = max(q_len for _, _, q_len, _ in short)
    max_blocks = -(-max(kv_len for *_, kv_len in short) // block_size)
    table: list[int] = []
    for s, _, _, kv_len in short:
        row = block_tables[s][: -(-kv_len // block_size)]
        table.extend(row)
        table.extend([0] * (max_blocks - len(row)))
    rows = [q_start + min(j, q_len - 1) for _, q_start, q_len, _ in short for j in range(width)]
    valid = [i * width + j for i, (_, _, q_len, _) in enumerate(short) for j in range(q_len)]
    # Row j sits at position kv_len - q_len + j and sees the keys up to it.
    last = torch.tensor([[kv_len - q_len + min(j, q_len - 1) for j in range(width)]
                         for _, _, q_len, kv_len in short])[:, :, None]  # fmt: skip  # (n, width, 1)
    keys = torch.arange(max_blocks * block_size)[None, None, :]
    masks: dict[int | None, torch.Tensor] = {}
    for w in windows:
        visible = keys <= last if w is None else (keys <= last) & (keys > last - w)
        masks[w] = visible.repeat_interleave(group, dim=1).unsqueeze(1)  # (n, 1, width * group, L)
    return ShortQueryPlan(
        width=width,
        rows=torch.tensor(rows, dtype=torch.int64),
        blocks=torch.tensor(table, dtype=torch.int64),
        masks=masks,
        valid=None if len(valid) == len(rows) else torch.tensor(valid, dtype=torch.int64),
        out_rows=torch.tensor([q_start + j for _, q_start, q_len, _ in short for j in range(q_len)]),
    )


def attend_short(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: ShortQueryPlan,
    window: int | None,
    scale: float,
    softcap: float | None,
    out: torch.Tensor,  # (num_tokens, num_heads, head_dim), written at plan.out_rows
    sinks: torch.Tensor | None = None,  # (num_heads,) per-head softmax sinks
) -> None:
    _, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group, width = num_heads // num_kv_heads, plan.width
    n = plan.rows.shape[0] // width
    q = query.index_select(0, plan.rows).view(n, width, num_kv_heads, group, head_dim)
    q = q.permute(0, 2, 1, 3, 4).reshape(n, num_kv_heads, width * group, head_dim)
    mask = plan.masks[window]
    if mask.shape[2] != width * group:  # planned for another group size
        mask = mask[:, :, :: mask.shape[2] // width].repeat_interleave(group, dim=2)
    shape = (n, -1, num_kv_heads, head_dim)  # (n, max_blocks * block_size, num_kv_heads, head_dim)
    k = k_cache.index_select(0, plan.blocks).view(shape).transpose(1, 2)
    v = v_cache.index_select(0, plan.blocks).view(shape).transpose(1, 2)
    sink = None if sinks is None else sinks_by_row(sinks, num_kv_heads, width)
    o = attend(q, k, v, mask, scale, softcap, sinks=sink)  # (n, kvh, width * group, d)
    o = o.view(n, num_kv_heads, width, group, head_dim).permute(0, 2, 1, 3, 4).reshape(-1, num_heads, head_dim)
    if plan.valid is not None:
        o = o.index_select(0, plan.valid)
    out.index_copy_(0, plan.out_rows, o)
