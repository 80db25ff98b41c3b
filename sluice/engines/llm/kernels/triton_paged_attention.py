"""Triton paged attention: one kernel for mixed prefill + decode batches over block tables.

Layout of the work (in the style of vLLM's unified attention):

* One program per (query block of one sequence, KV head). A query block is ``BLOCK_Q`` consecutive new
  tokens of a sequence; the ``G = num_heads // num_kv_heads`` query heads that share the KV head are packed
  into the same tile, so the tile has ``BLOCK_M >= BLOCK_Q * G`` rows (row m = token m // G, head m % G)
  and every K/V element loaded serves all G heads.
* The grid has an upper bound of programs (``num_tokens // BLOCK_Q + num_seqs``) so the host never reads
  the batch metadata; each program finds its sequence by a binary search over ``query_start_loc`` and
  exits if its query block is past the sequence's end.
* The program walks the sequence's KV positions ``BLOCK_N`` at a time, up to the last position its rows
  can see, looking up each position's physical block in the block table (an integer load, then computed
  offsets: this also runs under ``TRITON_INTERPRET=1``), with an online softmax in fp32. With a sliding
  window it starts at the first position its first row can see, so a long sequence costs a sliding layer
  only the window, not the whole context.
* Soft-capping (``HAS_SOFTCAP``) computes ``cap * tanh(score / cap)`` as ``cap * (2 * sigmoid(2x) - 1)``
  (Triton has no portable tanh), then moves to base 2 for ``exp2``.

Same contract as :func:`.reference.paged_attention`. Slots past a sequence's length are never loaded, so
unlike the torch path, uninitialised cache memory is harmless here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, qsl_ptr, seq_lens_ptr,
    sinks_ptr,  # HAS_SINKS: (num_heads,) fp32, a logit per head that joins the softmax with no value
    qk_scale,  # softmax scale, times log2(e) unless HAS_SOFTCAP: scores are exponentiated with exp2
    softcap,  # HAS_SOFTCAP: scores -> softcap * tanh(scores / softcap)
    sliding_window,  # HAS_WINDOW: a row sees positions > its own - sliding_window
    num_seqs,
    q_stride_t, q_stride_h, o_stride_t, o_stride_h,
    kc_stride_b, kc_stride_s, kc_stride_h, vc_stride_b, vc_stride_s, vc_stride_h,
    bt_stride_s,
    head_dim, block_size,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # tile rows, >= BLOCK_Q * GROUP, a power of two
    BLOCK_N: tl.constexpr,  # KV positions per loop step
    BLOCK_D: tl.constexpr,  # head_dim rounded up to a power of two
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32 rounding), None otherwise
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Sequence s owns programs [qsl[s] // BLOCK_Q + s, qsl[s + 1] // BLOCK_Q + s + 1): find the last s
    # whose first program is <= pid (the starts strictly increase with s).
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    seq = (lo - 1).to(tl.int64)  # type: ignore[attr-defined]  # a tensor once the loop ran
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # KV positions before this call's first new token

    offs_m = tl.arange(0, BLOCK_M)
    q_row = q_block * BLOCK_Q + offs_m // GROUP  # (BLOCK_M,) query row within the sequence
    head = kv_head * GROUP + offs_m % GROUP  # (BLOCK_M,) query head
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_row < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    token = (q_start + q_row).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    q_pos = context_len + q_row  # (BLOCK_M,) absolute position of each row

    if HAS_SINKS:  # the sink starts the running softmax: its max, and exp2(0) = 1 in the sum
        m_i = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the last row of this block sees positions < kv_end; nothing later is ever loaded
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    kv_start = 0
    if HAS_WINDOW:  # the first row of this block sees nothing before first_pos - window + 1
        first_seen = tl.maximum(context_len + q_block * BLOCK_Q - sliding_window + 1, 0)
        kv_start = (first_seen // BLOCK_N * BLOCK_N).to(tl.int32)
    bt_row = block_tables_ptr + seq * bt_stride_s
    for start_n in range(kv_start, kv_end, BLOCK_N):
        kv_pos = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        kv_ok = kv_pos < kv_end
        block_id = tl.load(bt_row + kv_pos // block_size, mask=kv_ok, other=0).to(tl.int64)
        in_block = (kv_pos % block_size).to(tl.int64)
        k_off = block_id * kc_stride_b + in_block * kc_stride_s + kv_head * kc_stride_h  # (BLOCK_N,)
        v_off = block_id * vc_stride_b + in_block * vc_stride_s + kv_head * vc_stride_h
        k = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None],
                    mask=kv_ok[None, :] & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
        v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :],
                    mask=kv_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)

        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N) fp32
        if HAS_SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0) * 1.4426950408889634
        visible = (kv_pos[None, :] <= q_pos[:, None]) & kv_ok[None, :]
        if HAS_WINDOW:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet stay at zero
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # padding rows (never stored)
    acc = acc / l_i[:, None]
    o_ptrs = out_ptr + token[:, None] * o_stride_t + head[:, None] * o_stride_h + offs_d[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def paged_attention(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks_per_seq) int32
    query_start_loc: torch.Tensor,  # (num_seqs + 1,) int32
    seq_lens: torch.Tensor,  # (num_seqs,) int32, KV length including the new tokens
    scale: float,
    out: torch.Tensor | None = None,  # (num_tokens, num_heads, head_dim)
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    fixed_tiles: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal paged attention of mixed prefill + decode sequences; see :func:`.reference.paged_attention`.

    ``fixed_tiles``: one tile shape whatever the batch, so a row's reductions (over ``BLOCK_N`` positions at a
    time from position 0, a fixed tile layout) are the same alone, beside other sequences or chunked: batch
    invariance (the engine's ``deterministic``). Otherwise the tile height follows the call's shape.

    ``head_dim`` must be the innermost, unit-stride dimension of query, out and caches; query, k_cache and
    v_cache must share a dtype (fp16, bf16 or fp32). The host reads no tensor values, so the call does not
    synchronise with the device.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"paged_attention: {num_heads} query heads is not a multiple of {num_kv_heads} KV heads")
    if not (query.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"paged_attention: query {query.dtype} and caches {k_cache.dtype}/{v_cache.dtype} differ")
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if query.stride(2) != 1:
        query = query.contiguous()
    if out.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("paged_attention: head_dim must be the innermost, contiguous dimension of out and caches")
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    query_start_loc, seq_lens = query_start_loc.contiguous(), seq_lens.contiguous()

    group = num_heads // num_kv_heads
    # Prefill-heavy calls get taller tiles (more reuse of each K/V load); decode-heavy calls small ones so
    # a one-token sequence does not waste most of its tile. Chosen from shapes only: no device sync.
    rows = 16 if fixed_tiles or num_tokens < 4 * num_seqs else 64
    block_m = max(rows, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
        query if sinks is None else sinks.float().contiguous(),
        scale if softcap is not None else scale * _LOG2E, float(softcap or 0.0), int(sliding_window or 0), num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        head_dim, k_cache.shape[1],
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=64,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else None,
        HAS_WINDOW=sliding_window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
    )
    return out
