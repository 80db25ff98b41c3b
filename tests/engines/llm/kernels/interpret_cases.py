"""Triton kernels against the reference under the Triton CPU interpreter.

Not collected by the main test run: ``test_triton_interpret.py`` runs this file in a child pytest with
``TRITON_INTERPRET=1`` (the interpreter must be chosen before the kernels are decorated, and must not leak
into the rest of the suite). The interpreter has no bf16, so fp32 and fp16 are covered here and bf16 only
by the CUDA tests. The last cases run tiny Gemma 2 and Mistral models end to end through the kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run through test_triton_interpret.py (needs TRITON_INTERPRET=1)", allow_module_level=True)

from sluice.engines.llm import LLM, SamplingParams, kernels  # noqa: E402
from sluice.engines.llm.kernels import reference  # noqa: E402
from sluice.engines.llm.kernels.synthetic import LAYOUTS, WINDOWED_LAYOUTS, Layout, make_batch  # noqa: E402
from sluice.engines.llm.kernels.triton_moe import grouped_matmul, reference_grouped_matmul  # noqa: E402
from sluice.engines.llm.kernels.triton_paged_attention import paged_attention  # noqa: E402
from sluice.engines.llm.kernels.triton_store_kv import store_kv  # noqa: E402
from tests.engines.llm.conftest import FAMILY_NEW_TOKENS, family_prompts  # noqa: E402

TOLERANCES = {torch.float32: 2e-5, torch.float16: 4e-3}

# the path CUDA takes: the Triton kernels fed padded block tables, per layer; torch's ops elsewhere (the
# native CPU kernels are not what these cases test, and building them is not the interpreter's business)
THROUGH_TRITON = {"attention": "triton", "cpu_attention": "paged", "native_cpu": False}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS + WINDOWED_LAYOUTS, ids=lambda layout: layout.name)
def test_attention_matches_reference(layout: Layout, dtype: torch.dtype) -> None:
    # NaN in every slot outside the sequences: the kernel must never load one
    batch = make_batch(layout, dtype=dtype, poison_unused=True)
    expected = reference.paged_attention(*batch.args(), **batch.options())
    out = torch.full_like(batch.query, float("nan"))  # rows the kernel forgets to write stay NaN
    got = paged_attention(*batch.args(), out=out, **batch.options())
    assert got is out and got.dtype == dtype
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS[:2] + WINDOWED_LAYOUTS[:1], ids=lambda layout: layout.name)
def test_attention_sinks_match_reference(layout: Layout, dtype: torch.dtype) -> None:
    batch = make_batch(layout, dtype=dtype, poison_unused=True)
    sinks = torch.randn(batch.query.shape[1], generator=torch.Generator().manual_seed(1)) * 2
    options = {**batch.options(), "sinks": sinks}
    expected = reference.paged_attention(*batch.args(), **options)
    got = paged_attention(*batch.args(), **options)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_dispatch_to_triton_runs_the_kernel() -> None:
    batch = make_batch(LAYOUTS[0], num_blocks=64)
    got = kernels.paged_attention(*batch.args(), path="triton")
    torch.testing.assert_close(got, reference.paged_attention(*batch.args()), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_store_kv_matches_reference_and_skips_negative_slots(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, num_kv_heads, head_dim = 1500, 16, 3, 64
    qkv = torch.randn(24, 15 * head_dim, generator=gen).to(dtype)  # a fused QKV projection
    key = qkv[:, 9 * head_dim:12 * head_dim].view(24, num_kv_heads, head_dim)  # strided views
    value = qkv[:, 12 * head_dim:].view(24, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:24].to(torch.int32)
    slots[::5] = -1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kv(key, value, k_ref, v_ref, slots)
    store_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_store_kv_with_an_odd_head_layout() -> None:
    key = torch.randn(5, 5, 48)  # 5 KV heads and head_dim 48: both padded inside the kernel
    value = torch.randn(5, 5, 48)
    k_cache, v_cache = torch.zeros(4, 4, 5, 48), torch.zeros(4, 4, 5, 48)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([15, 0, -1, 6, 9], dtype=torch.int64)
    reference.store_kv(key, value, k_ref, v_ref, slots)
    store_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize(("tokens", "top_k", "rows_per_input", "block_m"), [
    (1, 2, 2, 16),  # a decode row: two experts, most blocks absent
    (13, 3, 3, 16),  # gate/up of a prompt chunk: each token read three times
    (40, 1, 1, 32),  # down: one input row per output row; groups longer than a block
], ids=["decode", "gate-up", "down"])  # fmt: skip
@pytest.mark.parametrize("static_grid", [False, True], ids=["sized", "static-grid"])
def test_moe_grouped_matmul_matches_reference(
    dtype: torch.dtype, tokens: int, top_k: int, rows_per_input: int, block_m: int, static_grid: bool
) -> None:
    """Both launch sizes: read back from the routing, and from the shapes alone (a captured decode step's)."""
    gen = torch.Generator().manual_seed(tokens)
    num_experts, d_in, d_out = 7, 48, 80  # neither a multiple of the tiles
    rows = tokens * top_k
    ids = torch.randint(0, num_experts - 1, (rows,), generator=gen)  # the last expert is never chosen
    a = torch.randn(rows // rows_per_input, d_in, generator=gen).to(dtype)
    w = (torch.randn(num_experts, d_in, d_out, generator=gen) / d_in**0.5).to(dtype)
    got = grouped_matmul(a, w, ids, rows_per_input, block_m=block_m, static_grid=static_grid)
    torch.testing.assert_close(got, reference_grouped_matmul(a, w, ids, rows_per_input), atol=TOLERANCES[dtype],
                               rtol=TOLERANCES[dtype])  # fmt: skip


@pytest.mark.parametrize("family", ["gemma2", "mistral", "qwen3_moe", "gpt_oss"])
def test_engine_through_the_kernels_equals_hf(family: str, tiny_family_dir: Callable[..., Path],
                                              hf_greedy: Callable[..., list[list[int]]]) -> None:  # fmt: skip
    """Sliding windows (Mistral: every layer; Gemma 2: alternate layers), Gemma 2's soft-capped scores,
    Qwen3-MoE's experts, gpt-oss's sinks and biased experts, through the Triton kernels end to end: greedy
    tokens equal HF's, speculative verifies included."""
    llm = LLM(tiny_family_dir(family), enable_prefix_caching=False, num_speculative_tokens=2,
              speculative_adaptive=False, kernels=THROUGH_TRITON)  # fmt: skip
    prompts = family_prompts(llm.model_config.vocab_size)[:4]  # 5-37 tokens: the interpreter is slow
    outputs = llm.generate(prompts, SamplingParams(max_tokens=FAMILY_NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == hf_greedy(family)[:4]
    assert llm.stats.num_draft_tokens > 0


def test_engine_through_the_kernels_answers_each_prompt_as_alone(tiny_family_dir: Callable[..., Path]) -> None:
    """A tiny Llama through the Triton kernels (attention with ``fixed_tiles``, the engine's default): every
    prompt's greedy tokens and log-probabilities in a batch of four equal those of the prompt alone. (Chunked
    prefill moves a row to another row of its attention tile; the interpreter's dot is numpy's BLAS, whose sums
    depend on that, so only a GPU can check chunking there.)"""
    prompts = family_prompts(256)[:4]
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=True)
    llm = LLM(tiny_family_dir("llama"), enable_prefix_caching=False, kernels=THROUGH_TRITON)
    together = [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]
    alone = [(o.token_ids, o.logprobs) for p in prompts for o in llm.generate([p], params)]
    assert together == alone
