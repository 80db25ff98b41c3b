"""Slow, obviously-correct torch references for the KV store and paged attention.

Every fast path in this package (``torch_ops``, the Triton kernels) is tested against these two functions.
They loop over tokens / sequences and compute in fp32, trading all speed for clarity. Do not use them on
the hot path.
"""

from __future__ import annotations

import torch


def store_kv(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    slot_mapping: torch.Tensor,  # (num_tokens,) slot = block_id * block_size + offset; < 0 = skip
) -> None:
    """Write token i's key/value into slot ``slot_mapping[i]`` of the caches; negative slots are skipped."""
    block_size = k_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block_id, offset = divmod(slot, block_size)
        k_cache[block_id, offset] = key[i]
        v_cache[block_id, offset] = value[i]


def paged_attention(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks_per_seq)
    query_start_loc: torch.Tensor,  # (num_seqs + 1,)
    seq_lens: torch.Tensor,  # (num_seqs,) KV length including the new tokens
    scale: float,
    out: torch.Tensor | None = None,  # (num_tokens, num_heads, head_dim)
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged KV, one sequence at a time in fp32.

    Query row j of sequence s (q_len rows) sits at position ``seq_lens[s] - q_len + j`` and attends to KV
    positions ``0..`` that position -- with a ``sliding_window`` W only to positions ``> pos - W`` (the last W,
    itself included). Query head h reads KV head ``h // (num_heads // num_kv_heads)``. With ``softcap`` c the
    scaled scores become ``c * tanh(scores / c)`` before masking and softmax. With ``sinks`` (one logit per
    query head) each row's softmax has one more term, ``exp(sink)``, with no value: attention may go nowhere.
    """
    num_heads = query.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for s, kv_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_seq_blocks = (kv_len + block_size - 1) // block_size
        blocks = block_tables[s, :num_seq_blocks].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, k_cache.shape[3])[:kv_len].float()  # (kv_len, kvh, d)
        v = v_cache[blocks].reshape(-1, num_kv_heads, v_cache.shape[3])[:kv_len].float()
        k = k.repeat_interleave(group, dim=1)  # (kv_len, num_heads, d)
        v = v.repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # (q_len, num_heads, d)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # (num_heads, q_len, kv_len)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(kv_len - q_len, kv_len).unsqueeze(1)  # (q_len, 1)
        kv_pos = torch.arange(kv_len).unsqueeze(0)  # (1, kv_len)
        hidden = kv_pos > q_pos
        if sliding_window is not None:
            hidden |= kv_pos <= q_pos - sliding_window
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is not None:
            sink = sinks.float().view(num_heads, 1, 1).expand(num_heads, q_len, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
    return out
