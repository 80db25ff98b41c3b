"""KV block pool: allocation, ref counts, chained prefix hashes, LRU eviction and hit accounting."""

from __future__ import annotations

import pytest

from sluice.engines.llm.core.kv_cache import KVCacheManager, hash_block
from sluice.engines.llm.core.request import Request

BS = 4  # small blocks keep the prompts readable


def prompt(*blocks: int, tail: int = 0) -> list[int]:
    """Full blocks of BS tokens each filled with the given id, then ``tail`` tokens of 99."""
    return [b for b in blocks for _ in range(BS)] + [99] * tail


def compute(kv: KVCacheManager, request: Request, num_tokens: int | None = None) -> None:
    """Admit ``request`` with its prefix hits and pretend the model computed ``num_tokens`` (default all)."""
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    end = request.num_tokens if num_tokens is None else num_tokens
    assert kv.allocate_slots(request, end - num_hit_tokens, hits)
    request.num_computed_tokens = end
    kv.cache_blocks(request, end)


def test_allocation_grows_block_by_block_and_free_returns_everything() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    request = Request("a", list(range(10)))
    assert kv.allocate_slots(request, 10)
    assert len(request.block_ids) == 3 and len(set(request.block_ids)) == 3
    assert all(kv.ref_count(b) == 1 for b in request.block_ids)
    assert kv.num_free_blocks == 5 and kv.usage == pytest.approx(3 / 8)
    request.num_computed_tokens = 10
    assert kv.allocate_slots(request, 2)  # positions 10, 11 still fit in the third block
    assert len(request.block_ids) == 3
    assert kv.allocate_slots(request, 3)  # position 12 opens a fourth
    assert len(request.block_ids) == 4
    held = list(request.block_ids)
    kv.free(request)
    assert request.block_ids == [] and kv.num_free_blocks == 8 and kv.usage == 0.0
    assert all(kv.ref_count(b) == 0 for b in held)


def test_allocation_is_all_or_nothing_and_honours_the_reserve() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    big = Request("big", list(range(20)))
    assert not kv.allocate_slots(big, 20)  # needs 5 blocks
    assert big.block_ids == [] and kv.num_free_blocks == 4
    small = Request("small", list(range(8)))
    assert not kv.allocate_slots(small, 8, num_reserved_blocks=3)  # 2 + 3 reserved > 4
    assert kv.allocate_slots(small, 8, num_reserved_blocks=2)
    assert kv.num_free_blocks == 2


def test_same_prefix_shares_blocks_with_ref_counts() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    first = Request("a", prompt(1, 2, 3, tail=2))
    compute(kv, first)
    second = Request("b", prompt(1, 2, 3, tail=3))
    hits, num_hit_tokens = kv.get_computed_blocks(second)
    assert hits == first.block_ids[:3] and num_hit_tokens == 3 * BS
    assert kv.allocate_slots(second, second.num_tokens - num_hit_tokens, hits)
    assert second.block_ids[:3] == first.block_ids[:3]
    assert second.block_ids[3] != first.block_ids[3]  # partial tail blocks are private
    assert [kv.ref_count(b) for b in first.block_ids] == [2, 2, 2, 1]
    kv.free(first)
    assert [kv.ref_count(b) for b in second.block_ids] == [1, 1, 1, 1]


def test_a_different_earlier_block_changes_every_later_hash() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, Request("a", prompt(1, 2, 3, tail=1)))
    # Blocks 2 and 3 have the same tokens as before, but block 1 differs: nothing may be reused.
    other = Request("b", prompt(7, 2, 3, tail=1))
    assert kv.get_computed_blocks(other) == ([], 0)
    assert hash_block(b"", [2] * BS) != hash_block(hash_block(b"", [1] * BS), [2] * BS)
    assert (
        kv.request_block_hashes(other, 3)[1:] != kv.request_block_hashes(Request("c", prompt(1, 2, 3)), 3)[1:]
    )


def test_partial_last_block_is_never_cached() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, Request("a", prompt(1, tail=BS - 1)))
    assert kv.num_cached_blocks == 1
    # The same tokens followed by more: only the full block hits, not the partial one.
    hits, num_hit_tokens = kv.get_computed_blocks(Request("b", prompt(1, tail=BS - 1) + [5, 5, 5, 5, 5]))
    assert num_hit_tokens == BS and len(hits) == 1


def test_blocks_are_cached_only_once_computed() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    request = Request("a", prompt(1, 2, 3))
    compute(kv, request, num_tokens=BS + 1)  # a chunked prefill that stopped inside block 2
    assert kv.num_cached_blocks == 1
    assert kv.get_computed_blocks(Request("b", prompt(1, 2, 3, tail=1)))[1] == BS


def test_a_hit_never_covers_the_whole_prompt() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, Request("a", prompt(1, 2, tail=1)))
    same_blocks = Request("b", prompt(1, 2))  # exactly two full cached blocks
    hits, num_hit_tokens = kv.get_computed_blocks(same_blocks)
    assert num_hit_tokens == BS and len(hits) == 1  # the last token is always computed


def test_lru_evicts_the_least_recently_freed_cached_block_first() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    requests = [Request(name, prompt(token, tail=0)) for name, token in (("a", 1), ("b", 2), ("c", 3))]
    for request in requests:
        kv.allocate_slots(request, BS, [])
        request.num_computed_tokens = BS
        kv.cache_blocks(request, BS)
    for request in requests:  # freed a, then b, then c: all three stay cached and evictable
        kv.free(request)
    assert kv.num_free_blocks == 3 and kv.num_cached_blocks == 3

    def is_cached(token: int) -> bool:
        return kv.get_computed_blocks(Request("probe", prompt(token, tail=1)))[1] == BS

    # A hit on b's free block takes it out of the free queue: the next allocations must not evict it.
    b_again = Request("b2", prompt(2, tail=1))
    hits, _ = kv.get_computed_blocks(b_again)
    assert kv.allocate_slots(b_again, 1, hits)  # 1 hit + 1 new block for the tail: evicts a (oldest)
    assert not is_cached(1) and is_cached(2) and is_cached(3)
    newcomer = Request("n", [50])
    assert kv.allocate_slots(newcomer, 1)  # evicts c, the only free one left
    assert not is_cached(3) and is_cached(2)
    assert not kv.allocate_slots(Request("x", [1]), 1)  # b's block is held, not evictable


def test_a_chain_is_evicted_from_its_tail() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    request = Request("a", prompt(1, 2, 3))
    compute(kv, request)
    kv.free(request)
    assert kv.allocate_slots(Request("n", [50]), 1)  # must evict block 3 of the chain, not block 1
    hits, num_hit_tokens = kv.get_computed_blocks(Request("b", prompt(1, 2, 3, tail=1)))
    assert num_hit_tokens == 2 * BS and hits == request_blocks_of(kv, prompt(1, 2))


def request_blocks_of(kv: KVCacheManager, tokens: list[int]) -> list[int]:
    return kv.get_computed_blocks(Request("probe", tokens + [0]))[0]


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    cached = Request("a", prompt(1))
    compute(kv, cached)
    scratch = Request("s", [7, 7])  # a partial block: worthless once freed
    assert kv.allocate_slots(scratch, 2)
    kv.free(cached)  # freed first, yet it must outlive the scratch block
    kv.free(scratch)
    assert kv.allocate_slots(Request("n", [9]), 1)
    assert kv.get_computed_blocks(Request("b", prompt(1, tail=1)))[1] == BS


def test_two_requests_computing_the_same_prefix_keep_one_cached_copy() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    first, second = Request("a", prompt(1, tail=1)), Request("b", prompt(1, tail=1))
    for request in (first, second):  # both admitted before either computed: no hits for the second
        hits, _ = kv.get_computed_blocks(request)
        assert hits == [] and kv.allocate_slots(request, request.num_tokens, hits)
    for request in (first, second):
        request.num_computed_tokens = request.num_tokens
        kv.cache_blocks(request, request.num_tokens)
    assert kv.num_cached_blocks == 1
    assert kv.cached_hash(first.block_ids[0]) is not None and kv.cached_hash(second.block_ids[0]) is None
    cached_block = first.block_ids[0]
    kv.free(first)
    kv.free(second)
    assert kv.num_free_blocks == 8
    assert kv.get_computed_blocks(Request("c", prompt(1, tail=1)))[0] == [cached_block]


def test_hit_statistics_count_tokens_once_per_admission() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, Request("a", prompt(1, 2, tail=2)))  # 10 tokens, no hits
    compute(kv, Request("b", prompt(1, 2, tail=3)))  # 11 tokens, 8 hits
    kv.get_computed_blocks(Request("c", prompt(1, 2, tail=3)))  # a lookup without admission: not counted
    assert (kv.stats.num_queries, kv.stats.num_query_tokens, kv.stats.num_hit_tokens) == (2, 21, 8)
    assert kv.stats.hit_rate == pytest.approx(8 / 21)


def test_prefix_caching_off_never_hits() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    compute(kv, Request("a", prompt(1, 2, tail=1)))
    assert kv.num_cached_blocks == 0
    assert kv.get_computed_blocks(Request("b", prompt(1, 2, tail=1))) == ([], 0)
    assert kv.stats.num_query_tokens == 0


def test_reset_prefix_cache_forgets_free_blocks_only() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    held, freed = Request("a", prompt(1, tail=1)), Request("b", prompt(2, tail=1))
    compute(kv, held)
    compute(kv, freed)
    kv.free(freed)
    assert kv.reset_prefix_cache() == 1
    assert kv.get_computed_blocks(Request("c", prompt(2, tail=1)))[1] == 0
    assert kv.get_computed_blocks(Request("d", prompt(1, tail=1)))[1] == BS


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0), (True, 16)])
def test_bad_pool_shapes_are_rejected(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="num_blocks|block_size"):
        KVCacheManager(num_blocks, block_size)


def test_free_cached_hits_count_against_the_free_pool() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    first = Request("a", prompt(1, 2))
    compute(kv, first)
    kv.free(first)  # 3 free blocks, 2 of them the cached chain
    longer = Request("b", prompt(1, 2, 3, 4, tail=1))
    hits, num_hit_tokens = kv.get_computed_blocks(longer)
    assert num_hit_tokens == 2 * BS
    assert not kv.allocate_slots(longer, longer.num_tokens - num_hit_tokens, hits)  # 2 hits + 3 new > 3
    assert longer.block_ids == [] and kv.num_free_blocks == 3 and kv.num_cached_blocks == 2


@pytest.mark.parametrize("marked", [False, True])
def test_generated_blocks_stand_in_for_a_prompt_only_where_both_paths_compute_alike(marked: bool) -> None:
    """A later prompt that repeats an earlier prompt and its answer finds the answer's blocks cached unless the
    runner computes prompt and generated positions differently (``mark_prompt_positions``); the request's
    own blocks, after a preemption, are found either way."""
    kv = KVCacheManager(num_blocks=32, block_size=BS, mark_prompt_positions=marked)
    first = Request("a", prompt(1, 2, tail=1))  # 9 prompt tokens: block 2 holds 1 prompt + 3 generated
    first.output_token_ids = [7, 7, 7] + [8] * BS + [5]  # blocks 2 and 3 complete, one token past
    compute(kv, first)
    continued = Request("b", first.prompt_token_ids + first.output_token_ids)
    hits, num_hit_tokens = kv.get_computed_blocks(continued)
    assert num_hit_tokens == (2 * BS if marked else 4 * BS)  # the all-prompt blocks only, or all four
    preempted = Request("a", first.prompt_token_ids)
    preempted.output_token_ids = list(first.output_token_ids)
    assert kv.get_computed_blocks(preempted)[1] == 4 * BS
    assert hash_block(b"", [1] * BS, BS) == hash_block(b"", [1] * BS)  # all-prompt blocks hash as before
