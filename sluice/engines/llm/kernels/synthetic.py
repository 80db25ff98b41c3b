"""Random paged-attention batches, and a catalogue of ragged layouts, for kernel tests and benchmarks.

A :class:`PagedBatch` holds everything one ``paged_attention`` call takes: random queries, random caches
whose sequences live in shuffled, non-contiguous blocks (ids spread over the whole pool, so in the
thousands for a big pool), block tables padded with 0, cumulative query lengths and KV lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """A batch shape: per-sequence new-token counts and total KV lengths, plus the head layout."""

    q_lens: tuple[int, ...]  # new tokens of each sequence (1 = decode, 0 = no rows this call)
    kv_lens: tuple[int, ...]  # KV length of each sequence including its new tokens (>= q_len, >= 1)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    sliding_window: int | None = None  # attend to the last this-many positions only
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap)

    @property
    def name(self) -> str:
        extra = (f"_w{self.sliding_window}" if self.sliding_window else "") + (f"_c{self.softcap:g}" if self.softcap else "")
        return (f"q{'-'.join(map(str, self.q_lens))}_kv{'-'.join(map(str, self.kv_lens))}"
                f"_h{self.num_heads}x{self.num_kv_heads}_d{self.head_dim}_b{self.block_size}{extra}")


# Ragged layouts that hit the kernels' edges: decode at block boundaries, long prefills, chunks continuing
# a partly computed sequence or following a prefix-cache hit, zero-row sequences, GQA groups 3/1/8.
LAYOUTS: tuple[Layout, ...] = (
    Layout((1, 1, 1, 1, 1, 1), (1, 2, 15, 16, 17, 300), 9, 3, 64),  # decode only
    Layout((1, 130, 1, 17, 1), (40, 1300, 1250, 77, 1), 9, 3, 64),  # mixed; 130 after 1170; 17 after a 60 hit
    Layout((5, 1, 64), (5, 1000, 264), 4, 4, 64),  # MHA; chunk continuing a 200-token prefix
    Layout((1, 33, 2, 1), (1, 533, 1100, 17), 8, 1, 32),  # MQA, head_dim 32
    Layout((16, 48), (32, 48), 9, 3, 32),  # prefill only: a continued chunk and a fresh prompt
    Layout((0, 3, 1), (10, 3, 20), 9, 3, 64, block_size=8),  # a sequence with no new rows; block size 8
)

# Sliding windows (Mistral, Gemma, Phi-3) and soft-capped scores (Gemma 2): windows shorter than a block,
# not a multiple of one, and longer than some sequences; prefills far past the window; caps that bite.
WINDOWED_LAYOUTS: tuple[Layout, ...] = (
    Layout((1, 1, 1, 1), (1, 9, 17, 300), 8, 4, 32, sliding_window=10),  # decode only
    Layout((1, 130, 1, 17, 5), (40, 1300, 1250, 77, 5), 9, 3, 64, sliding_window=100),  # mixed
    Layout((3, 64, 2), (300, 64, 9), 4, 4, 64, block_size=8, sliding_window=5),  # tiny window, small blocks
    Layout((1, 33, 4), (700, 533, 20), 8, 2, 64, softcap=2.0),  # soft-cap alone
    Layout((1, 40, 1, 7), (4000, 200, 33, 7), 8, 4, 32, sliding_window=64, softcap=30.0),  # Gemma 2: both
)


@dataclass(frozen=True)
class PagedBatch:
    """The arguments of one paged-attention call (and the caches to store into)."""

    query: torch.Tensor  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor  # (num_seqs, max_blocks_per_seq) int32, padded with 0
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32
    seq_lens: torch.Tensor  # (num_seqs,) int32
    scale: float
    sliding_window: int | None = None
    softcap: float | None = None

    def options(self) -> dict[str, float | int | None]:
        """Keyword arguments of ``paged_attention`` beyond :meth:`args` (window and soft-cap)."""
        return {"sliding_window": self.sliding_window, "softcap": self.softcap}

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, float]:
        """Positional arguments for ``paged_attention``."""
        return (self.query, self.k_cache, self.v_cache, self.block_tables, self.query_start_loc,
                self.seq_lens, self.scale)


def make_batch(
    layout: Layout,
    dtype: torch.dtype = torch.float32,
    num_blocks: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    poison_unused: bool = False,
) -> PagedBatch:
    """A random batch of ``layout``; blocks are drawn from a shuffled pool of ``num_blocks`` ids.

    ``num_blocks`` defaults to 2048 (or the blocks needed, if more). With ``poison_unused`` every cache
    slot that holds no position of any sequence is NaN, to prove a kernel never reads outside the
    sequences (the torch path requires finite slots and must not be given such caches).
    """
    bs = layout.block_size
    if len(layout.q_lens) != len(layout.kv_lens):
        raise ValueError("make_batch: q_lens and kv_lens differ in length")
    blocks_per_seq = [-(-kv // bs) for kv in layout.kv_lens]
    needed = sum(blocks_per_seq)
    num_blocks = max(num_blocks or 2048, needed + 1)
    gen = torch.Generator().manual_seed(seed)
    cache_shape = (num_blocks, bs, layout.num_kv_heads, layout.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen)
    v_cache = torch.randn(cache_shape, generator=gen)
    pool = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(layout.kv_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    used = torch.zeros(num_blocks * bs, dtype=torch.bool)
    taken = 0
    for s, (kv_len, n) in enumerate(zip(layout.kv_lens, blocks_per_seq, strict=True)):
        ids = pool[taken:taken + n]
        taken += n
        block_tables[s, :n] = ids.to(torch.int32)
        slots = (ids[:, None] * bs + torch.arange(bs)).reshape(-1)[:kv_len]
        used[slots] = True
    if poison_unused:
        unused = ~used.view(num_blocks, bs)
        k_cache[unused] = float("nan")
        v_cache[unused] = float("nan")
    q_lens = torch.tensor(layout.q_lens, dtype=torch.int32)
    query_start_loc = torch.zeros(len(layout.q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    num_tokens = int(query_start_loc[-1])
    query = torch.randn(num_tokens, layout.num_heads, layout.head_dim, generator=gen)
    return PagedBatch(
        query=query.to(device=device, dtype=dtype),
        k_cache=k_cache.to(device=device, dtype=dtype),
        v_cache=v_cache.to(device=device, dtype=dtype),
        block_tables=block_tables.to(device),
        query_start_loc=query_start_loc.to(device),
        seq_lens=torch.tensor(layout.kv_lens, dtype=torch.int32, device=device),
        scale=layout.head_dim ** -0.5,
        sliding_window=layout.sliding_window,
        softcap=layout.softcap,
    )
