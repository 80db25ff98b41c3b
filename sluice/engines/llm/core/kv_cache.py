"""Paged KV-cache bookkeeping: one pool of fixed-size blocks, ref counts, and a prefix cache.

This module decides *which* block holds which positions; the tensors themselves live in the model runner
(layout ``(num_blocks, block_size, num_kv_heads, head_dim)`` per layer, slot = block_id * block_size +
offset). Pure Python: never imports torch.

Prefix caching. Every *full* block of a request gets a chained hash::

    hash_i = blake2b-128(hash_{i-1} || token ids of block i)      (hash_{-1} = the request's cache_salt)

so two requests share block ``i`` only if they agree on every token of blocks ``0..i`` and on the salt
(requests whose K/V for the same tokens differs, as LongRoPE's long-context ones, get a salt of their own).
A full block whose K/V is computed is registered under its hash; a later request whose prompt starts with
the same blocks takes references on them instead of recomputing. The hash is blake2b (not Python's
``hash``) so that it is stable across processes and a collision -- which would silently serve another
prompt's K/V -- is negligible (2**-64 at a billion blocks).

Free queue and eviction (LRU). A block whose ref count drops to zero goes back to the free queue:

* a block that is not cached (partial, or a duplicate of an already-cached block) goes to the *front*,
  since its contents are worthless and should be reused first;
* a cached block goes to the *back*, still findable by its hash. A request's blocks are released last
  block first, so the deepest block of a chain is evicted before its parents.

New blocks are taken from the front; taking a cached block evicts its hash. A prefix-cache hit on a free
cached block takes it out of the free queue without evicting it. So among cached blocks, the least recently
freed one is reused first.

Guarantees: ``num_free_blocks`` counts free + evictable cached blocks; a block's ref count always equals
the number of request block tables holding it; a hit never covers a request's last token (at least one
position is always computed, so the model produces logits).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from sluice.engines.llm.core.request import Request


def hash_block(parent_hash: bytes, token_ids: list[int], prompt_positions: int | None = None) -> bytes:
    """Chained hash of one full block: blake2b-128 over the parent's hash and the block's token ids, and --
    for a block only partly in its request's prompt, when the manager marks them -- how many positions are."""
    digest = hashlib.blake2b(parent_hash, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    if prompt_positions is not None and prompt_positions < len(token_ids):
        digest.update(b"prompt positions %d" % prompt_positions)
    return digest.digest()


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache effectiveness, counted once per admission (not per scheduling attempt)."""

    num_queries: int = 0  # admissions that looked up the cache
    num_query_tokens: int = 0  # tokens those admissions asked for
    num_hit_tokens: int = 0  # tokens served from the cache

    @property
    def hit_rate(self) -> float:
        """Fraction of queried tokens that were hits (0.0 before any query)."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


class KVCacheManager:
    """Allocates and frees KV blocks for requests, with optional prefix caching.

    Called only by the scheduler (single-threaded). ``allocate_slots`` is all-or-nothing.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 mark_prompt_positions: bool = False) -> None:  # fmt: skip
        """``mark_prompt_positions``: the runner computes prompt positions and generated ones through different
        matmuls (int4 weights without Sluice's kernel), so a block holding generated tokens must not stand in
        for the same tokens in a later request's prompt: such blocks hash with their prompt count."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.mark_prompt_positions = mark_prompt_positions
        self.stats = PrefixCacheStats()
        self._ref_counts: list[int] = [0] * num_blocks
        self._block_hashes: list[bytes | None] = [None] * num_blocks  # hash of a registered (cached) block
        self._hash_to_block: dict[bytes, int] = {}
        # Ordered set: front = next to reuse. Holds exactly the blocks with ref count 0.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # request_id -> number of its leading full blocks already registered (skip them next time)
        self._num_registered: dict[str, int] = {}

    # ---- read-only views -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: never-used, freed, and cached-but-evictable ones."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (0..1); evictable cached blocks count as free."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently registered in the prefix cache (held or evictable)."""
        return len(self._hash_to_block)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def cached_hash(self, block_id: int) -> bytes | None:
        """The hash a block is registered under, or None if it is not in the prefix cache."""
        return self._block_hashes[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def request_block_hashes(self, request: Request, num_full_blocks: int) -> list[bytes]:
        """Chained hashes of the request's first ``num_full_blocks`` blocks (computed once, then kept)."""
        hashes = request.block_hashes
        size = self.block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else request.cache_salt
            in_prompt = max(0, min(size, request.num_prompt_tokens - i * size)) if self.mark_prompt_positions else None
            hashes.append(hash_block(parent, request.token_ids_in(i * size, (i + 1) * size), in_prompt))
        return hashes[:num_full_blocks]

    # ---- prefix cache lookup -------------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest run of the request's leading full blocks found in the prefix cache.

        Returns ``(block_ids, num_tokens)``. Takes no references (pass the blocks to ``allocate_slots``
        right away). Never covers the request's last token: at most ``(num_tokens - 1) // block_size``
        blocks, so at least one position is computed and the model yields logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in self.request_block_hashes(request, max_blocks):
            block_id = self._hash_to_block.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits, len(hits) * self.block_size

    # ---- allocation ----------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: list[int] | None = None,
        *,
        num_reserved_blocks: int = 0,
    ) -> bool:
        """Grow ``request.block_ids`` to cover its computed positions + ``num_new_tokens``.

        ``computed_blocks`` (admission only, from ``get_computed_blocks``; ``[]`` for none): prefix-cache
        hits to put at the head of an empty block table; references are taken on them. Passing a list (even
        empty) marks this as an admission and records prefix-cache statistics on success.

        ``num_reserved_blocks``: fail unless this many free blocks remain afterwards (admission watermark).

        Returns False and changes nothing if there are not enough free blocks. Does not change
        ``request.num_computed_tokens`` (the scheduler does).
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        hits = computed_blocks or []
        if hits and (request.block_ids or request.num_computed_tokens):
            raise ValueError(f"request {request.request_id!r}: prefix hits given for a non-empty block table")
        num_covered = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        num_new_blocks = self.num_blocks_for(num_covered) - len(request.block_ids) - len(hits)
        num_hits_in_free = sum(1 for block_id in hits if self._ref_counts[block_id] == 0)
        if num_new_blocks + num_hits_in_free + num_reserved_blocks > len(self._free):
            return False
        # Take the hits first so that popping new blocks below cannot evict them.
        for block_id in hits:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1
            request.block_ids.append(block_id)
        for _ in range(num_new_blocks):
            block_id, _unused = self._free.popitem(last=False)
            self._evict(block_id)
            self._ref_counts[block_id] = 1
            request.block_ids.append(block_id)
        if hits:
            self._num_registered[request.request_id] = len(hits)
        if computed_blocks is not None and self.enable_prefix_caching:
            self.stats.num_queries += 1
            self.stats.num_query_tokens += request.num_tokens
            self.stats.num_hit_tokens += len(hits) * self.block_size
        return True

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks that are full and computed up to ``num_computed_tokens``.

        Called by the scheduler after each step. A block whose hash is already registered (another request
        computed the same prefix at the same time) stays unregistered and is freed normally later.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed_tokens // self.block_size, len(request.block_ids))
        start = self._num_registered.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self.request_block_hashes(request, num_full)
        for i in range(start, num_full):
            block_id = request.block_ids[i]
            if self._block_hashes[block_id] is not None:
                continue  # a prefix hit: already registered
            if hashes[i] not in self._hash_to_block:
                self._hash_to_block[hashes[i]] = block_id
                self._block_hashes[block_id] = hashes[i]
        self._num_registered[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Drop the request's references and empty its block table.

        Blocks reaching ref count 0 return to the free queue: cached ones at the back (last block first, so
        chains are evicted from the tail), uncached ones at the front.
        """
        for block_id in reversed(request.block_ids):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
                if self._block_hashes[block_id] is None:
                    self._free.move_to_end(block_id, last=False)
        request.block_ids.clear()
        self._num_registered.pop(request.request_id, None)

    def trim(self, request: Request, num_tokens: int) -> int:
        """Drop the request's blocks past the first ``num_blocks_for(num_tokens)``; return how many.

        Used after a speculative step rejected drafts: their positions' K/V is garbage and is recomputed
        when those positions are computed again. The trimmed blocks hold no registered (full, computed)
        positions, so they go to the front of the free queue like any uncached block.
        """
        keep = self.num_blocks_for(num_tokens)
        num_trimmed = 0
        while len(request.block_ids) > keep:
            block_id = request.block_ids.pop()
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
                if self._block_hashes[block_id] is None:
                    self._free.move_to_end(block_id, last=False)
            num_trimmed += 1
        return num_trimmed

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no request holds (e.g. after a weight reload). Returns how many."""
        num_evicted = 0
        for block_id in self._free:
            if self._block_hashes[block_id] is not None:
                self._evict(block_id)
                num_evicted += 1
        return num_evicted

    def _evict(self, block_id: int) -> None:
        block_hash = self._block_hashes[block_id]
        if block_hash is not None:
            if self._hash_to_block.get(block_hash) == block_id:
                del self._hash_to_block[block_hash]
            self._block_hashes[block_id] = None
