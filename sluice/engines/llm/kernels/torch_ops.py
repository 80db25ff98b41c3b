"""Fast CPU path of the KV store and paged attention, in vectorised torch.

Used by the engine when its tensors live on the CPU (and as the fallback where Triton is absent). Same
contract as :mod:`.reference`, with one extra requirement on the caches:

* **Every cache slot must hold finite values** (allocate caches with ``torch.zeros``, not ``torch.empty``).
  Whole blocks are gathered at once, so slots past a sequence's length (the unused tail of its last block,
  and padding entries of the block table) go through the matmuls with a zero weight; a NaN there would
  poison the row. Stale values of freed blocks are finite and therefore harmless.

How it is fast: one ``index_select`` per call gathers every sequence's blocks into a padded
``(num_seqs, max_kv, num_kv_heads, head_dim)`` tensor, and a single ``scaled_dot_product_attention`` runs
over all sequences with a causal + length mask. GQA is folded into the query length: the ``G`` query heads
that share a KV head become ``G`` extra query rows of that KV head, so K/V are never expanded. Decode
sequences (one new token) and prefill chunks are attended in two separate calls so that a long prefill does
not pad every decode sequence to its length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    slot_mapping: torch.Tensor,  # (num_tokens,) slot = block_id * block_size + offset; < 0 = skip
) -> None:
    """Scatter each token's key/value into its slot; tokens whose slot is negative are skipped."""
    slots = slot_mapping.to(torch.long)
    if slots.numel() == 0:
        return
    if int(slots.min()) < 0:
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    _scatter_rows(k_cache, slots, key)
    _scatter_rows(v_cache, slots, value)


def _scatter_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    rows = rows.to(cache.dtype)
    try:
        flat = cache.view(num_blocks * block_size, num_kv_heads, head_dim)  # a view: writes reach the cache
    except RuntimeError:  # block and slot dims not mergeable (unusual strides): index both dims instead
        cache[slots // block_size, slots % block_size] = rows
        return
    flat.index_copy_(0, slots, rows)


def paged_attention(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks_per_seq)
    query_start_loc: torch.Tensor,  # (num_seqs + 1,)
    seq_lens: torch.Tensor,  # (num_seqs,) KV length including the new tokens
    scale: float,
    out: torch.Tensor | None = None,  # (num_tokens, num_heads, head_dim)
) -> torch.Tensor:
    """Causal paged attention over mixed decode + prefill sequences; see :func:`.reference.paged_attention`."""
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    starts = query_start_loc.tolist()
    q_lens = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    decode = [s for s, n in enumerate(q_lens) if n == 1]
    prefill = [s for s, n in enumerate(q_lens) if n > 1]
    device = query.device
    if decode:
        if len(decode) == len(q_lens):  # decode-only batch: no index building, no subset copies
            _attend(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out, max_q=1)
        else:
            sel = torch.tensor(decode, device=device)
            _attend(query, k_cache, v_cache, block_tables[sel], query_start_loc[sel],
                    seq_lens[sel], scale, out, max_q=1)
    if prefill:
        sel = torch.tensor(prefill, device=device)
        _attend(query, k_cache, v_cache, block_tables[sel], query_start_loc[sel], seq_lens[sel], scale,
                out, max_q=max(q_lens[s] for s in prefill), q_lens=torch.tensor(
                    [q_lens[s] for s in prefill], device=device))
    return out


def _attend(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim) all tokens of the call
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (S, max_blocks_per_seq) the S sequences attended here
    q_starts: torch.Tensor,  # (>= S,) first query row of each of the S sequences (extra entries ignored)
    seq_lens: torch.Tensor,  # (S,)
    scale: float,
    out: torch.Tensor,  # (num_tokens, num_heads, head_dim) rows of the S sequences are written
    max_q: int,
    q_lens: torch.Tensor | None = None,  # (S,) query rows per sequence; None means all 1 (decode)
) -> None:
    """Attend S sequences padded to ``max_q`` query rows and their longest KV length, in one SDPA call."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    lens = seq_lens.to(torch.long)
    max_kv = int(lens.max())
    num_kv_blocks = -(-max_kv // block_size)
    padded_kv = num_kv_blocks * block_size

    blocks = block_tables[:, :num_kv_blocks].reshape(-1).to(torch.long)
    k = k_cache.index_select(0, blocks).view(num_seqs, padded_kv, num_kv_heads, head_dim)
    v = v_cache.index_select(0, blocks).view(num_seqs, padded_kv, num_kv_heads, head_dim)
    if k.dtype != query.dtype:
        k, v = k.to(query.dtype), v.to(query.dtype)
    kv_pos = torch.arange(padded_kv, device=query.device)  # (padded_kv,)
    first_rows = q_starts[:num_seqs].to(torch.long)  # (S,)

    if q_lens is None:  # decode: one query row per sequence, at position len - 1
        q = query.index_select(0, first_rows).view(num_seqs, num_kv_heads, group, head_dim)
        mask = (kv_pos < lens[:, None]).view(num_seqs, 1, 1, padded_kv)
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
        out.index_copy_(0, first_rows, o.reshape(num_seqs, num_heads, head_dim).to(out.dtype))
        return

    j = torch.arange(max_q, device=query.device)  # (max_q,)
    q_lens = q_lens.to(torch.long)
    valid = j < q_lens[:, None]  # (S, max_q) real query rows
    # padded rows repeat the sequence's last row, so every row has a sane (finite) attention pattern
    j_clamped = torch.minimum(j[None, :], q_lens[:, None] - 1)  # (S, max_q)
    rows = first_rows[:, None] + j_clamped  # (S, max_q) row of `query`
    q_pos = lens[:, None] - q_lens[:, None] + j_clamped  # (S, max_q) absolute position of each row
    q = query.index_select(0, rows.reshape(-1)).view(num_seqs, max_q, num_kv_heads, group, head_dim)
    q = q.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, max_q * group, head_dim)
    mask = kv_pos[None, None, :] <= q_pos[:, :, None]  # (S, max_q, padded_kv) causal, implies < len
    mask = mask.repeat_interleave(group, dim=1).unsqueeze(1)  # (S, 1, max_q * group, padded_kv)
    o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
    o = o.view(num_seqs, num_kv_heads, max_q, group, head_dim).permute(0, 2, 1, 3, 4)
    o = o.reshape(num_seqs * max_q, num_heads, head_dim)  # (S * max_q, num_heads, head_dim)
    flat_valid = valid.reshape(-1)
    out.index_copy_(0, rows.reshape(-1)[flat_valid], o[flat_valid].to(out.dtype))
