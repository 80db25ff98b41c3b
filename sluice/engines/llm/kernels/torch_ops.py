"""Fast CPU path of the KV store and paged attention, in vectorised torch.

Used by the engine when its tensors live on the CPU (and as the fallback where Triton is absent). Same
contract as :mod:`.reference`, with one extra requirement on the caches:

* **Every cache slot must hold finite values** (allocate caches with ``torch.zeros``, not ``torch.empty``).
  Whole blocks are gathered at once, so slots past a sequence's length (the unused tail of its last block,
  and padding entries of the block table) go through the matmuls with a zero weight; a NaN there would
  poison the row. Stale values of freed blocks are finite and therefore harmless.

How it is fast: sequences are sorted by KV length and cut into chunks whose gathered K+V fit in about
``CHUNK_BYTES`` (cache-sized); per chunk, one ``index_select`` gathers the sequences' blocks into a padded
``(S, max_kv, num_kv_heads, head_dim)`` tensor and a single ``scaled_dot_product_attention`` runs over all
of them with a causal + length mask. K/V are never expanded for GQA: for decode the ``G`` query heads that
share a KV head become ``G`` query rows of that KV head; prefill uses SDPA's ``enable_gqa`` (faster there
than folding: ``bench/attention_kernels.py``). Decode sequences (one new token) and prefill chunks never share a chunk, so a
long prefill does not pad decode rows to its length.

Sliding windows only change the masks; soft-capped scores (which SDPA cannot express) go through
:func:`attend`'s explicit matmul / tanh / softmax, in the order HF transformers' eager attention uses.
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


# Gathered K+V of one chunk of sequences stays under this many bytes, so that it is still in cache when
# SDPA reads it back: gathering a large decode batch at once overflows the caches, chunks too small pay a
# per-chunk overhead; 2 MiB was best or tied on every case bench/attention_kernels.py tried.
CHUNK_BYTES = 2 << 20


def attend(
    q: torch.Tensor,  # (B, Hq, Lq, D)
    k: torch.Tensor,  # (B, Hk, Lk, D), Hq a multiple of Hk (query head h reads KV head h // (Hq // Hk))
    v: torch.Tensor,  # (B, Hk, Lk, D)
    mask: torch.Tensor | None,  # bool, broadcastable to (B, Hq, Lq, Lk) or (Lq, Lk); True = may attend
    scale: float,
    softcap: float | None = None,
    causal: bool = False,  # with mask None: causal over the last Lq of Lk = Lq positions
    # a logit per query head joining each row's softmax, with no value (gpt-oss): broadcastable to
    # (B, Hk, Hq // Hk, Lq, 1), see sinks_by_group / sinks_by_row
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # (B, Hq, Lq, D)
    """Attention with an optional score soft-cap and attention sinks (gpt-oss): SDPA without either, explicit
    matmul + tanh + softmax with them."""
    gqa = q.shape[1] != k.shape[1]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                              scale=scale, enable_gqa=gqa)  # fmt: skip
    b, hq, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    qg = q.view(b, hk, hq // hk, lq, d)  # the query heads of each KV head
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale  # (B, Hk, G, Lq, Lk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None and causal:
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    if mask is not None:
        scores = scores.masked_fill(~(mask if mask.dim() == 2 else mask.unsqueeze(2)), float("-inf"))
    if sinks is not None:  # one more column per row: the head's sink, dropped after the softmax
        sink = sinks.to(scores.dtype).expand(b, hk, hq // hk, lq, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
        return torch.matmul(probs, v.unsqueeze(2)).view(b, hq, lq, d)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v.unsqueeze(2)).view(b, hq, lq, d)


def sinks_by_group(sinks: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``attend``'s sinks when the query heads are its head dimension: ``(1, Hk, G, 1, 1)``."""
    return sinks.view(1, num_kv_heads, -1, 1, 1)


def sinks_by_row(sinks: torch.Tensor, num_kv_heads: int, width: int = 1) -> torch.Tensor:
    """``attend``'s sinks when each KV head's query heads are its rows, ``width`` positions of ``G`` heads
    each (one-token decodes: width 1): ``(1, Hk, 1, width * G, 1)``."""
    group = sinks.numel() // num_kv_heads
    return sinks.view(num_kv_heads, 1, group).expand(num_kv_heads, width, group).reshape(1, num_kv_heads, 1, -1, 1)


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
    """Causal paged attention over mixed decode + prefill sequences; see :func:`.reference.paged_attention`."""
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    starts = query_start_loc.tolist()
    kv_lens = seq_lens.tolist()
    q_lens = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    bytes_per_pos = 2 * num_kv_heads * head_dim * query.element_size()  # K + V of one position
    by_len = sorted(range(len(kv_lens)), key=kv_lens.__getitem__)  # similar lengths share a chunk
    for decode in (True, False):
        seqs = [s for s in by_len if (q_lens[s] == 1) == decode and q_lens[s] > 0]
        for chunk in _chunks(seqs, kv_lens, block_size, bytes_per_pos):
            _attend(query, k_cache, v_cache, block_tables, chunk, starts, q_lens, kv_lens, scale, out, decode,
                    sliding_window, softcap, sinks)
    return out


def _chunks(seqs: list[int], kv_lens: list[int], block_size: int, bytes_per_pos: int) -> list[list[int]]:
    """Split ``seqs`` (sorted by KV length) into runs whose padded, gathered K+V fit in CHUNK_BYTES."""
    chunks: list[list[int]] = []
    current: list[int] = []
    for s in seqs:
        padded_kv = -(-kv_lens[s] // block_size) * block_size  # the longest so far: seqs are sorted
        if current and (len(current) + 1) * padded_kv * bytes_per_pos > CHUNK_BYTES:
            chunks.append(current)
            current = []
        current.append(s)
    if current:
        chunks.append(current)
    return chunks


def _attend(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim) all tokens of the call
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (num_seqs, max_blocks_per_seq)
    seqs: list[int],  # the S sequences attended here
    starts: list[int],  # (num_seqs + 1) first query row of every sequence
    q_lens: list[int],  # (num_seqs) query rows of every sequence
    kv_lens: list[int],  # (num_seqs) KV length of every sequence
    scale: float,
    out: torch.Tensor,  # (num_tokens, num_heads, head_dim) rows of the S sequences are written
    decode: bool,  # every sequence of `seqs` has exactly one query row
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None = None,
) -> None:
    """Attend S sequences, padded to their most query rows and longest KV, with one SDPA call."""
    num_seqs = len(seqs)
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    device = query.device
    max_kv = max(kv_lens[s] for s in seqs)
    num_kv_blocks = -(-max_kv // block_size)
    padded_kv = num_kv_blocks * block_size

    sel = torch.tensor(seqs, device=device)
    blocks = block_tables[:, :num_kv_blocks].index_select(0, sel).reshape(-1).to(torch.long)
    k = k_cache.index_select(0, blocks).view(num_seqs, padded_kv, num_kv_heads, head_dim)
    v = v_cache.index_select(0, blocks).view(num_seqs, padded_kv, num_kv_heads, head_dim)
    if k.dtype != query.dtype:
        k, v = k.to(query.dtype), v.to(query.dtype)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (S, num_kv_heads, padded_kv, head_dim)
    kv_pos = torch.arange(padded_kv, device=device)  # (padded_kv,)
    lens = torch.tensor([kv_lens[s] for s in seqs], device=device)  # (S,)

    if decode:  # one query row per sequence, at position len - 1
        rows = torch.tensor([starts[s] for s in seqs], device=device)  # (S,)
        q = query.index_select(0, rows).view(num_seqs, num_kv_heads, group, head_dim)
        mask = kv_pos < lens[:, None]  # (S, padded_kv)
        if sliding_window is not None:
            mask &= kv_pos >= lens[:, None] - sliding_window
        sink = None if sinks is None else sinks_by_row(sinks, num_kv_heads)
        o = attend(q, k, v, mask.view(num_seqs, 1, 1, padded_kv), scale, softcap, sinks=sink)
        out.index_copy_(0, rows, o.reshape(num_seqs, num_heads, head_dim).to(out.dtype))
        return

    max_q = max(q_lens[s] for s in seqs)
    n_q = torch.tensor([q_lens[s] for s in seqs], device=device)  # (S,)
    first_rows = torch.tensor([starts[s] for s in seqs], device=device)  # (S,)
    j = torch.arange(max_q, device=device)  # (max_q,)
    # padded rows repeat the sequence's last row, so every row has a sane (finite) attention pattern
    j_clamped = torch.minimum(j[None, :], n_q[:, None] - 1)  # (S, max_q)
    rows = (first_rows[:, None] + j_clamped).reshape(-1)  # (S * max_q,) row of `query`
    q_pos = lens[:, None] - n_q[:, None] + j_clamped  # (S, max_q) absolute position of each row
    q = query.index_select(0, rows).view(num_seqs, max_q, num_heads, head_dim).transpose(1, 2)
    mask = kv_pos[None, None, :] <= q_pos[:, :, None]  # (S, max_q, padded_kv)
    if sliding_window is not None:
        mask &= kv_pos[None, None, :] > q_pos[:, :, None] - sliding_window
    sink = None if sinks is None else sinks_by_group(sinks, num_kv_heads)
    o = attend(q, k, v, mask.unsqueeze(1), scale, softcap, sinks=sink)  # (S, num_heads, max_q, head_dim)
    o = o.transpose(1, 2).reshape(num_seqs * max_q, num_heads, head_dim)  # (S * max_q, num_heads, head_dim)
    if any(q_lens[s] != max_q for s in seqs):  # drop the padded rows
        keep = (j[None, :] < n_q[:, None]).reshape(-1).nonzero().squeeze(1)
        rows, o = rows.index_select(0, keep), o.index_select(0, keep)
    out.index_copy_(0, rows, o.to(out.dtype))
