"""The LLM engine end to end on a tiny random Llama: scheduling choices never change greedy outputs.

Chunked prefill, prefix-cache hits, and preemption by recompute each take a different path through the
KV cache; a bug in any of them (a wrong slot, a stale block, a lost position) changes the tokens. Every
run is compared with an unconstrained reference run of the same prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engines.llm import LLM, RequestOutput, SamplingParams

TokensOf = list[list[int]]


def _prompts(num: int, lengths: list[int], seed: int = 0, prefix: list[int] | None = None) -> TokensOf:
    gen = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths[:num]]


def _tokens(outputs: list[RequestOutput]) -> TokensOf:
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Callable[[bool], Path]) -> Path:
    return tiny_llama_dir(False)


LENGTHS = [3, 40, 17, 90, 1, 64, 33]
PARAMS = SamplingParams(max_tokens=20)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> TokensOf:
    """Greedy outputs with no constraint: whole prompts in one step, no prefix cache, a large KV pool."""
    llm = LLM(tiny, enable_prefix_caching=False, kv_cache_memory_bytes=1 << 24)
    return _tokens(llm.generate(_prompts(7, LENGTHS), PARAMS))


def test_chunked_prefill_gives_the_same_tokens(tiny: Path, reference: TokensOf) -> None:
    llm = LLM(tiny, max_num_batched_tokens=7, enable_prefix_caching=False)
    assert _tokens(llm.generate(_prompts(7, LENGTHS), PARAMS)) == reference
    # 248 prompt tokens through a 7-token budget: prompts really were split over many steps.
    assert llm.stats.num_steps > 248 // 7


def test_prefix_cache_hits_give_the_same_tokens(tiny: Path, reference: TokensOf) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    first = llm.generate(_prompts(7, LENGTHS), PARAMS)
    second = llm.generate(_prompts(7, LENGTHS), PARAMS)
    assert _tokens(first) == reference and _tokens(second) == reference
    assert sum(o.num_cached_tokens for o in second) > 0
    assert all(o.num_cached_tokens == 0 for o in first)
    assert llm.stats.prefix_cache_hit_rate > 0


def test_shared_prefix_across_requests_hits_the_cache(tiny: Path) -> None:
    prefix = _prompts(1, [48], seed=3)[0]
    prompts = _prompts(4, [5, 9, 2, 20], seed=4, prefix=prefix)
    cold = LLM(tiny, enable_prefix_caching=False)
    expected = _tokens(cold.generate(prompts, PARAMS))
    warm = LLM(tiny, max_num_seqs=1)  # one at a time: later requests find the prefix already cached
    outputs = warm.generate(prompts, PARAMS)
    assert _tokens(outputs) == expected
    assert [o.num_cached_tokens for o in outputs][1:] == [48, 48, 48]


def test_kernel_attention_path_gives_the_same_tokens(tiny: Path, reference: TokensOf) -> None:
    """The path CUDA takes (padded block tables -> kernels.store_kv / paged_attention), run on the CPU."""
    llm = LLM(tiny, max_num_batched_tokens=24, kernels={"cpu_attention": "paged"})
    assert not llm.runner.cpu_attention_plan
    assert _tokens(llm.generate(_prompts(7, LENGTHS), PARAMS)) == reference


def test_preemption_gives_the_same_tokens(tiny: Path, reference: TokensOf) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=14 * _block_bytes(tiny), enable_prefix_caching=False)
    assert llm.stats.num_kv_blocks == 14
    assert _tokens(llm.generate(_prompts(7, LENGTHS), PARAMS)) == reference
    assert llm.stats.num_preemptions > 0


def _block_bytes(tiny: Path) -> int:
    return LLM(tiny, kv_cache_memory_bytes=1 << 20).runner.bytes_per_block


def test_abort_frees_every_block(tiny: Path) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 22)
    ids = [llm.add_request(p, SamplingParams(max_tokens=50)) for p in _prompts(5, LENGTHS)]
    for _ in range(3):
        llm.step()
    assert llm.stats.kv_usage > 0
    assert all(llm.abort(i) for i in ids)
    assert not llm.has_unfinished()
    assert llm.step() == []
    assert llm.stats.kv_usage == 0.0 and llm.kv.num_free_blocks == llm.kv.num_blocks
    assert not llm.abort(ids[0])  # already gone


def test_too_long_prompt_is_a_clear_error(tiny: Path) -> None:
    llm = LLM(tiny, max_model_len=64)
    with pytest.raises(ValueError, match=r"prompt has 64 tokens but max_model_len is 64"):
        llm.add_request(list(range(64)))
    with pytest.raises(ValueError, match=r"prompt has 70 tokens"):
        llm.generate([[1, 2, 3], list(range(70))])  # all or nothing: the short prompt is not left behind
    assert not llm.has_unfinished()
    small_pool = LLM(tiny, kv_cache_memory_bytes=4 * _block_bytes(tiny))  # 4 blocks = 64 positions
    with pytest.raises(ValueError, match=r"prompt \(60 tokens\) plus max_tokens \(100\) needs 10 KV blocks"):
        small_pool.add_request(list(range(60)), SamplingParams(max_tokens=100))
    small_pool.add_request(list(range(60)), SamplingParams(max_tokens=4))  # 63 positions fit
    with pytest.raises(ValueError, match="token id 999 >= vocab size 256"):
        llm.add_request([999])
    assert not llm.has_unfinished()


def test_a_max_model_len_above_the_model_context_is_lowered_with_a_warning(
    tiny: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="sluice.engines.llm.llm_engine"):
        llm = LLM(tiny, max_model_len=4096)  # the tiny Llama's context is 512
    assert llm.max_model_len == 512
    assert "max_model_len 4096 is more than the model's context of 512 tokens; using 512" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sluice.engines.llm.llm_engine"):
        assert LLM(tiny, max_model_len=128).max_model_len == 128
    assert "max_model_len" not in caplog.text


def test_generation_stops_at_max_model_len(tiny: Path) -> None:
    llm = LLM(tiny, max_model_len=40)
    [out] = llm.generate([list(range(30))], SamplingParams(max_tokens=100))
    assert out.finish_reason == "length" and len(out.token_ids) == 10


workloads = st.lists(
    st.tuples(
        st.integers(1, 80),  # prompt length
        st.integers(1, 24),  # max_tokens
        st.one_of(st.none(), st.integers(0, 30)),  # abort at this step (None = never)
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads, num_blocks=st.integers(12, 40), prefix_caching=st.booleans(), seed=st.integers(0, 9))
def test_random_workload_leaks_nothing(
    tiny: Path, workload: list[tuple[int, int, int | None]], num_blocks: int, prefix_caching: bool, seed: int
) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=num_blocks * 12288, enable_prefix_caching=prefix_caching,
              max_num_batched_tokens=32, max_num_seqs=4)  # fmt: skip
    assert llm.runner.bytes_per_block == 12288
    prompts = _prompts(len(workload), [n for n, _, _ in workload], seed=seed)
    ids: dict[str, tuple[int, int | None]] = {}
    for prompt, (_, max_tokens, abort_at) in zip(prompts, workload, strict=True):
        ids[llm.add_request(prompt, SamplingParams(max_tokens=max_tokens))] = (max_tokens, abort_at)
    finished: dict[str, RequestOutput] = {}
    for step in range(2000):
        for rid, (_, abort_at) in ids.items():
            if abort_at == step and rid not in finished:
                llm.abort(rid)
        for out in llm.step():
            finished[out.request_id] = out
        if not llm.has_unfinished():
            break
    assert not llm.has_unfinished()
    assert llm.kv.num_free_blocks == llm.kv.num_blocks and llm.stats.kv_usage == 0.0
    for rid, out in finished.items():
        assert out.finish_reason == "length" and len(out.token_ids) == ids[rid][0]
    assert all(abort_at is not None for rid, (_, abort_at) in ids.items() if rid not in finished)
