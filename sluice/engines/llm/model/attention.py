"""Attention over the paged KV cache: the per-step metadata and the two back-ends.

``AttentionMetadata`` is built once per step by the model runner and shared by every layer. Each layer
calls :func:`store_and_attend` with its :class:`AttentionParams`: on CUDA it uses the Triton kernels of
``kernels/`` (``store_kv`` and ``paged_attention``, one launch each for the whole mixed prefill/decode
batch); on the CPU it uses the torch path below, which is planned once per step
(:func:`plan_cpu_attention`). Where the native kernel is built (:mod:`.kernels.native_cpu`) every row --
decode, speculative verify, prompt chunk -- is attended by it as a one-token query of its own length, reading
its sequence's keys and values in order from position 0: a row's attention is then the same bits whatever
shares its step, however its prompt is chunked and whatever the prefix cache held (batch invariance, see
``docs/llm.md``). Without it, the torch path: decodes share one gather and one attention call per layer,
sequences with a few new tokens (2..``MAX_BATCHED_QUERY_LEN``: speculative verifies of ``1 + k`` tokens) one
batched call, their queries padded to the longest of them (:mod:`.attention_short`), and longer chunks
(prompts) one call each -- sums whose order depends on the batch.

Semantics (both back-ends): sequence ``s`` owns query rows ``query_start_loc[s]:query_start_loc[s+1]``
(``q_len`` rows) at positions ``seq_lens[s] - q_len + j``; each row attends causally to KV positions
``0..`` its own position of the same sequence -- with a sliding window ``W``, only to the last ``W`` of them
(positions ``> pos - W``, as HF transformers' sliding-window mask). Query head ``h`` reads KV head
``h // (H // KVH)``. With a soft-cap ``c``, scores become ``c * tanh(scores / c)`` before masking (Gemma 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernels import graph_ops, kernel_path
from sluice.engines.llm.kernels.torch_ops import attend, sinks_by_group, sinks_by_row
from sluice.engines.llm.model.attention_short import (
    MAX_BATCHED_QUERY_LEN,
    ShortQueryPlan,
    attend_short,
    plan_short_queries,
)

Window = int | None  # a sliding window in positions; None = full causal attention


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """How one layer attends: its softmax scale, sliding window, score soft-cap and sinks."""

    scale: float
    sliding_window: int | None = None  # keys at positions > query position - window; None = all
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap); None = off
    sinks: torch.Tensor | None = None  # (num_heads,) gpt-oss: a logit per head joining the softmax; no value


@dataclass(slots=True)
class PrefillPlan:
    """One sequence with more than one new token (a prompt or a prompt chunk), CPU path."""

    q_start: int
    q_end: int
    kv_len: int
    blocks: torch.Tensor  # (num_seq_blocks,) int64 the blocks holding positions 0..kv_len-1
    # per window: (q_len, kv_len) bool, True = may attend; None = plain causal (no context, no window)
    masks: dict[Window, torch.Tensor | None] = field(default_factory=dict)


@dataclass(slots=True)
class CpuAttentionPlan:
    """Index tensors for the CPU path; built once per step, used by every layer."""

    decode_rows: torch.Tensor | None = None  # (num_decodes,) int64 flat query rows of 1-token sequences
    decode_blocks: torch.Tensor | None = None  # (num_decodes * max_blocks,) int64, rows padded with block 0
    # per window: (num_decodes, 1, 1, max_blocks * block_size) bool, True = key visible
    decode_masks: dict[Window, torch.Tensor] = field(default_factory=dict)
    decode_only: bool = False  # every sequence decodes one token: query row i is decode row i
    decode_lens: torch.Tensor | None = None  # (num_decodes,) int64 KV length of each decode row's sequence
    short: ShortQueryPlan | None = None  # sequences with a few new tokens (speculative verifies)
    prefills: list[PrefillPlan] = field(default_factory=list)
    # per-row plan (see plan_cpu_attention): every query row's block-table row and KV length
    row_blocks: torch.Tensor | None = None  # (num_tokens, max_blocks) int64, padded with block 0
    row_lens: torch.Tensor | None = None  # (num_tokens,) int64: the row's position + 1
    native: bool = False  # decode rows through the native kernel (the engine's KernelPlan.native_cpu)


@dataclass(slots=True)
class AttentionMetadata:
    """What every layer needs to write and read the paged KV cache for one step."""

    slot_mapping: torch.Tensor  # (num_tokens,) int64 slot = block_id * block_size + offset
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32 cumulative query rows
    seq_lens: torch.Tensor  # (num_seqs,) int32 KV length after this step (context + new tokens)
    block_tables: torch.Tensor  # (num_seqs, max_blocks_per_seq) int32, padded with 0
    max_seq_len: int
    cpu_plan: CpuAttentionPlan | None = None  # set on the CPU path only
    fixed_tiles: bool = True  # kernels: one tile shape whatever the batch (EngineConfig.deterministic)
    kernel_path: str | None = None  # kernels' path (KernelPlan.attention); None: the device's default
    # (num_tokens,) int64, 1 = rotate this row with LongRoPE's long factors; None = none do (see
    # ModelConfig.long_rope_switch_len)
    long_rope: torch.Tensor | None = None


def plan_cpu_attention(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    group: int = 1,
    windows: Sequence[int] = (),
    per_row: bool = False,
    native: bool = False,
) -> CpuAttentionPlan:
    """Precompute gather indices and masks for one step on the CPU (plain Python lists in).

    ``group``: query heads per KV head (the model's; only shapes the short-query mask, any value works).
    ``windows``: the sliding windows of the model's layers; masks are built for each and for full attention.
    ``per_row`` (the native kernel is built): a step with rows other than one-token decodes attends every
    row as a decode row of its own length -- the native kernel's fixed order over KV positions -- so a row's
    attention is the same whether its prompt is computed whole, in chunks, after a prefix-cache hit or
    beside other requests (batch invariance); only ``row_blocks`` / ``row_lens`` are planned then.
    """
    if per_row and any(q != 1 for q in query_lens):
        return _plan_rows(query_lens, seq_lens, block_tables, block_size)
    plan = CpuAttentionPlan(native=native)
    keys: list[Window] = [None, *sorted(set(windows))]
    decode_rows: list[int] = []
    decode_seqs: list[int] = []
    short: list[tuple[int, int, int, int]] = []  # (sequence, q_start, q_len, kv_len)
    q_start = 0
    for s, (q_len, kv_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if q_len == 1:
            decode_rows.append(q_start)
            decode_seqs.append(s)
        elif 1 < q_len <= MAX_BATCHED_QUERY_LEN:
            short.append((s, q_start, q_len, kv_len))
        elif q_len > 1:
            num_blocks = -(-kv_len // block_size)
            blocks = torch.tensor(block_tables[s][:num_blocks], dtype=torch.int64)
            prefill = PrefillPlan(q_start, q_start + q_len, kv_len, blocks)
            q_pos = torch.arange(kv_len - q_len, kv_len).unsqueeze(1)  # (q_len, 1)
            kv_pos = torch.arange(kv_len).unsqueeze(0)  # (1, kv_len)
            for w in keys:
                if w is not None and w >= kv_len:  # the window covers the whole sequence
                    prefill.masks[w] = prefill.masks[None]
                elif w is None:
                    prefill.masks[w] = kv_pos <= q_pos if kv_len > q_len else None
                else:
                    prefill.masks[w] = (kv_pos <= q_pos) & (kv_pos > q_pos - w)
            plan.prefills.append(prefill)
        q_start += q_len
    if decode_rows:
        # Gather whole blocks (one contiguous copy each), not single slots: several times faster.
        lens = [seq_lens[s] for s in decode_seqs]
        max_blocks = -(-max(lens) // block_size)
        table: list[int] = []
        for s, kv_len in zip(decode_seqs, lens, strict=True):
            row = block_tables[s][: -(-kv_len // block_size)]
            table.extend(row)
            table.extend([0] * (max_blocks - len(row)))
        positions = torch.arange(max_blocks * block_size).unsqueeze(0)  # (1, max_blocks * block_size)
        lens_t = torch.tensor(lens).unsqueeze(1)  # (num_decodes, 1)
        plan.decode_rows = torch.tensor(decode_rows, dtype=torch.int64)
        plan.decode_only = len(decode_rows) == len(query_lens)
        plan.decode_blocks = torch.tensor(table, dtype=torch.int64)
        plan.decode_lens = lens_t.view(-1)
        full = positions < lens_t
        for w in keys:
            visible = full if w is None or w >= max(lens) else full & (positions >= lens_t - w)
            plan.decode_masks[w] = visible[:, None, None, :]
    if short:
        plan.short = plan_short_queries(short, block_tables, block_size, group, keys)
    return plan


def _plan_rows(query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int
               ) -> CpuAttentionPlan:  # fmt: skip
    """Every row's block-table row (its sequence's, padded) and KV length (its position + 1)."""
    widths = [-(-kv_len // block_size) for kv_len in seq_lens]
    max_blocks = max(widths)
    table = torch.tensor([t[:w] + [0] * (max_blocks - w) for t, w in zip(block_tables, widths, strict=True)],
                         dtype=torch.int64)  # fmt: skip
    q_lens, kv_lens = torch.tensor(query_lens), torch.tensor(seq_lens)
    seq_of_row = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
    first_row = torch.cumsum(q_lens, 0) - q_lens  # each sequence's first row
    offset = torch.arange(int(q_lens.sum())) - first_row[seq_of_row]  # a row's place in its sequence's rows
    lens = (kv_lens - q_lens)[seq_of_row] + offset + 1
    return CpuAttentionPlan(row_blocks=table.index_select(0, seq_of_row), row_lens=lens.to(torch.int64), native=True)


def store_and_attend(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    meta: AttentionMetadata,
    params: AttentionParams,
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
    """Write this step's K/V into the cache, then attend each new token over its sequence's cache.

    Returns the attention in ``query``'s dtype; on the CPU, queries of another dtype than the cache's are
    attended in the cache's dtype and converted back."""
    if meta.cpu_plan is None:  # the kernels; in a compiled decode step, as one opaque call
        op = graph_ops.store_and_attend if graph_ops.compiling() else graph_ops.store_then_attend
        return op(query, key, value, k_cache, v_cache, meta.slot_mapping, meta.block_tables, meta.query_start_loc,
                  meta.seq_lens, params.scale, params.sliding_window, params.softcap, meta.fixed_tiles, params.sinks,
                  meta.kernel_path or kernel_path(query))  # fmt: skip
    return _cpu_store_and_attend(query, key, value, k_cache, v_cache, meta.slot_mapping, meta.cpu_plan, params)


def _cpu_store_and_attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    plan: CpuAttentionPlan,
    params: AttentionParams,
) -> torch.Tensor:
    model_dtype, kv_dtype = query.dtype, k_cache.dtype
    if plan.row_blocks is not None and plan.row_lens is not None:  # per row: stores every row, then attends
        return _native_decode(query, key, value, k_cache, v_cache, slot_mapping, plan.row_blocks, plan.row_lens,
                              params).to(model_dtype)  # fmt: skip
    native = (plan.decode_rows is not None and kv_dtype in native_cpu.DTYPES and k_cache.is_contiguous()
              and v_cache.is_contiguous() and params.sinks is None and plan.native)
    if native and plan.decode_only:  # the common step: one native call stores and attends every row
        return _native_decode(query, key, value, k_cache, v_cache, slot_mapping, *_decode_table(plan),
                              params).to(model_dtype)  # fmt: skip
    # a bf16 pool under fp32 activations (packed weights): attend in the pool's dtype
    query, key, value = (t if t.dtype == kv_dtype else t.to(kv_dtype) for t in (query, key, value))
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    window, scale, softcap, sinks = params.sliding_window, params.scale, params.softcap, params.sinks
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # (num_slots, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slot_mapping, key)
    v_flat.index_copy_(0, slot_mapping, value)
    if native and plan.decode_rows is not None:  # stored above: the kernel only attends
        o = _native_decode(query.index_select(0, plan.decode_rows), None, None, k_cache, v_cache, None,
                           *_decode_table(plan), params)  # fmt: skip
        out = torch.empty_like(query)
        out.index_copy_(0, plan.decode_rows, o.to(out.dtype))
    elif plan.decode_rows is not None and plan.decode_blocks is not None:
        n = plan.decode_rows.shape[0]
        # The `group` query heads sharing a KV head become `group` query rows of one attention problem.
        q = query if plan.decode_only else query.index_select(0, plan.decode_rows)
        q = q.reshape(n, num_kv_heads, group, head_dim)
        shape = (n, -1, num_kv_heads, head_dim)  # (n, max_blocks * block_size, num_kv_heads, head_dim)
        k = k_cache.index_select(0, plan.decode_blocks).view(shape).transpose(1, 2)
        v = v_cache.index_select(0, plan.decode_blocks).view(shape).transpose(1, 2)
        sink = None if sinks is None else sinks_by_row(sinks, num_kv_heads)
        o = attend(q, k, v, plan.decode_masks[window], scale, softcap, sinks=sink).reshape(n, num_heads, head_dim)
        if plan.decode_only:  # every row is a decode, in order: no scatter
            return o if o.dtype == model_dtype else o.to(model_dtype)
        out = torch.empty_like(query)
        out.index_copy_(0, plan.decode_rows, o)
    else:
        out = torch.empty_like(query)
    if plan.short is not None:
        attend_short(query, k_cache, v_cache, plan.short, window, scale, softcap, out, sinks)
    for p in plan.prefills:
        q = query[p.q_start : p.q_end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, q_len, head_dim)
        k = k_cache.index_select(0, p.blocks).view(-1, num_kv_heads, head_dim)[: p.kv_len]
        v = v_cache.index_select(0, p.blocks).view(-1, num_kv_heads, head_dim)[: p.kv_len]
        k = k.transpose(0, 1).unsqueeze(0)  # (1, num_kv_heads, kv_len, head_dim)
        v = v.transpose(0, 1).unsqueeze(0)
        sink = None if sinks is None else sinks_by_group(sinks, num_kv_heads)
        o = attend(q, k, v, p.masks[window], scale, softcap, causal=p.masks[window] is None, sinks=sink)
        out[p.q_start : p.q_end] = o.squeeze(0).transpose(0, 1)
    return out if out.dtype == model_dtype else out.to(model_dtype)


_NOTHING, _NO_SLOTS = torch.empty(0), torch.empty(0, dtype=torch.int64)  # "stored already"


def _native_decode(
    query: torch.Tensor,  # (n, num_heads, head_dim): the decode rows only
    key: torch.Tensor | None,  # (n, num_kv_heads, head_dim); None with slot_mapping None = stored already
    value: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor | None,
    blocks: torch.Tensor,  # (n * max_blocks,) or (n, max_blocks) int64: each row's block-table row
    lens: torch.Tensor,  # (n,) int64 each row's KV length
    params: AttentionParams,
) -> torch.Tensor:  # (n, num_heads, head_dim) in query's dtype (float32 for another)
    n = query.shape[0]
    dtype = query.dtype if query.dtype in native_cpu.DTYPES else torch.float32
    q = query.to(dtype)
    k = _NOTHING if key is None else key.to(dtype)
    v = _NOTHING if value is None else value.to(dtype)
    slots = _NO_SLOTS if slot_mapping is None else slot_mapping
    return native_cpu.decode_attention(q, k, v, k_cache, v_cache, slots, blocks.view(n, -1), lens, params.scale,
                                       params.sliding_window, params.softcap)  # fmt: skip


def _decode_table(plan: CpuAttentionPlan) -> tuple[torch.Tensor, torch.Tensor]:
    assert plan.decode_blocks is not None and plan.decode_lens is not None
    return plan.decode_blocks, plan.decode_lens
