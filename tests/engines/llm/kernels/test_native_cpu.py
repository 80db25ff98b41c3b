"""The native CPU decode-attention kernel against the reference, through the engine's entry point.

The kernel must build here (CI has a compiler and ninja): a test that silently fell back to the torch path
would test nothing, so the first test asserts it loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernels import reference
from sluice.engines.llm.model.attention import (
    AttentionMetadata,
    AttentionParams,
    plan_cpu_attention,
    store_and_attend,
)


def test_the_kernel_builds_on_this_machine() -> None:
    assert native_cpu.load() is not None and native_cpu.usable()


def _decode_step(lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 cache_dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """A decode-only step: sequence i has lens[i] positions after it (its new token last), scattered blocks,
    stale finite values everywhere else in the caches."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lens]
    slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, lens, strict=True)]
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen)
    k = torch.randn(len(lens), num_kv_heads, head_dim, generator=gen)
    v = torch.randn(len(lens), num_kv_heads, head_dim, generator=gen)
    return q, k, v, k_cache, v_cache, torch.tensor(slots), tables  # type: ignore[return-value]


def _meta(lens: list[int], tables: list[list[int]], slots: torch.Tensor, block_size: int, group: int,
          window: int | None, native: bool = True) -> AttentionMetadata:
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seq_len=max(lens),
        cpu_plan=plan_cpu_attention([1] * len(lens), lens, tables, block_size, group,
                                    windows=(window,) if window else (), native=native),
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=9),
       heads=st.sampled_from([(1, 1), (4, 4), (6, 2), (9, 3), (8, 1), (32, 8)]),
       head_dim=st.sampled_from([8, 64, 80, 128]), block_size=st.sampled_from([1, 4, 16]),
       cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       window=st.sampled_from([None, 1, 7, 64]), softcap=st.sampled_from([None, 5.0]), seed=st.integers(0, 99))
def test_decode_steps_match_the_reference(lens: list[int], heads: tuple[int, int], head_dim: int, block_size: int,
                                          cache_dtype: torch.dtype, window: int | None, softcap: float | None,
                                          seed: int) -> None:  # fmt: skip
    """Stores land where the reference puts them and every row's attention equals the reference's over the
    same cache (a bfloat16 cache: its values widened to float32, as the kernel reads them)."""
    num_heads, num_kv_heads = heads
    q, k, v, k_cache, v_cache, slots, tables = _decode_step(lens, num_heads, num_kv_heads, head_dim, block_size,
                                                           cache_dtype, seed)  # fmt: skip
    meta = _meta(lens, tables, slots, block_size, num_heads // num_kv_heads, window)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reference.store_kv(k, v, ref_k, ref_v, slots)
    expected = reference.paged_attention(q, ref_k.float(), ref_v.float(), meta.block_tables, meta.query_start_loc,
                                         meta.seq_lens, head_dim**-0.5, sliding_window=window, softcap=softcap)
    got = store_and_attend(q, k, v, k_cache, v_cache, meta, AttentionParams(head_dim**-0.5, window, softcap))
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    assert got.dtype == q.dtype
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_native_and_torch_paths_agree_on_a_decode_batch(cache_dtype: torch.dtype) -> None:
    lens = [1, 17, 64, 65, 200, 333]
    step = _decode_step(lens, 9, 3, 64, 16, cache_dtype, seed=1)
    q, k, v, k_cache, v_cache, slots, tables = step
    meta = _meta(lens, tables, slots, 16, 3, None)
    params = AttentionParams(0.125)
    got = store_and_attend(q, k, v, k_cache.clone(), v_cache.clone(), meta, params)
    torch_meta = _meta(lens, tables, slots, 16, 3, None, native=False)
    torch_path = store_and_attend(q, k, v, k_cache.clone(), v_cache.clone(), torch_meta, params)
    tol = 2e-5 if cache_dtype == torch.float32 else 2e-2  # the torch path attends a bf16 cache in bf16
    torch.testing.assert_close(got, torch_path, rtol=tol, atol=tol)


def test_a_block_id_outside_the_cache_is_an_error_not_a_wild_read() -> None:
    q, k, v, k_cache, v_cache, slots, tables = _decode_step([20], 4, 2, 8, 4, torch.float32, seed=2)
    blocks = torch.tensor([[0, 1, 2, 3, k_cache.shape[0]]])
    with pytest.raises(RuntimeError, match="block id out of range"):
        native_cpu.decode_attention(q, k, v, k_cache, v_cache, slots, blocks, torch.tensor([20]), 0.3, None, None)


def test_a_machine_without_a_compiler_keeps_the_torch_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from torch.utils import cpp_extension

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))  # the attempt's empty build folder goes here
    native_cpu.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert native_cpu.load() is None
        assert "native CPU kernels unavailable (Ninja is required" in caplog.text
        lens = [5, 9]
        q, k, v, k_cache, v_cache, slots, tables = _decode_step(lens, 4, 2, 8, 4, torch.float32, seed=3)
        meta = _meta(lens, tables, slots, 4, 2, None, native=native_cpu.usable())  # as the engine's plan asks
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        reference.store_kv(k, v, ref_k, ref_v, slots)
        expected = reference.paged_attention(q, ref_k, ref_v, meta.block_tables, meta.query_start_loc,
                                             meta.seq_lens, 0.3)
        got = store_and_attend(q, k, v, k_cache, v_cache, meta, AttentionParams(0.3))
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
    finally:
        native_cpu.load.cache_clear()


@pytest.mark.parametrize("shape", [(576,), (1, 576), (7, 960), (3, 5, 64), (300, 2048)], ids=str)
def test_rms_norm_equals_torch_to_float_rounding(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(shape, generator=gen) * 3
    w = torch.randn(shape[-1], generator=gen)
    expected = torch.nn.functional.rms_norm(x, (shape[-1],), w, 1e-5)
    got = native_cpu.rms_norm(x, w, 1e-5)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    strided = x.transpose(0, -1) if x.dim() > 1 else x  # a non-contiguous input is read as its values
    torch.testing.assert_close(native_cpu.rms_norm(strided.contiguous().transpose(0, -1), w, 1e-5), expected,
                               rtol=1e-5, atol=1e-6)


def test_the_llama_norm_module_runs_the_native_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.engines.llm.model.layers.norm import RMSNorm

    norm = RMSNorm(64, 1e-6)
    calls: list[int] = []
    real = native_cpu.rms_norm
    monkeypatch.setattr(native_cpu, "rms_norm", lambda x, w, eps: calls.append(1) or real(x, w, eps))
    x = torch.randn(4, 64)
    with torch.inference_mode():
        out = norm(x)
    assert calls == [1]
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (64,), norm.weight, 1e-6))
    norm.native = False  # the engine's plan without the native kernels (use_kernels)
    with torch.inference_mode():
        norm(x)
    assert calls == [1]  # switched off: torch's


@pytest.mark.parametrize(("heads", "head_dim", "rotary_dim"), [(12, 64, 64), (3, 128, 64), (1, 96, 32)])
def test_rotary_is_torchs_bit_for_bit_in_float32_and_bf16(heads: int, head_dim: int,
                                                                         rotary_dim: int) -> None:
    from sluice.engines.llm.model.layers import rotary as rotary_layer

    gen = torch.Generator().manual_seed(5)
    n = 7
    qkv = torch.randn(n, (heads + 2) * head_dim, generator=gen)
    x = qkv[:, : heads * head_dim].view(n, heads, head_dim)  # a strided view, as the attention layer passes
    angles = torch.rand(n, 1, rotary_dim // 2, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)

    def torch_path(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rotated = rotary_layer._rotate(x[..., :rotary_dim], cos, sin)
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)

    assert torch.equal(native_cpu.rotary(x, cos, sin), torch_path(x, cos, sin))
    xb, cb, sb = x.to(torch.bfloat16), cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    assert torch.equal(native_cpu.rotary(xb, cb, sb), torch_path(xb, cb, sb))
    with torch.inference_mode():  # the layer's entry point takes the kernel
        assert torch.equal(rotary_layer.apply_rotary(x, cos, sin), torch_path(x, cos, sin))


def test_silu_mul_rounds_as_torch_does() -> None:
    gen = torch.Generator().manual_seed(6)
    gate_up = (torch.randn(5, 2 * 1536, generator=gen) * 4).to(torch.bfloat16)
    gate, up = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up  # bf16 ops, as the MLP without the kernel
    got = native_cpu.silu_mul(gate_up)
    assert got.shape == (5, 1536) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-5)  # one bf16 step at most
    assert (got != want).float().mean() < 0.01  # the exp differs from torch's only in its last float bits


def _top_k_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k best of each row by (value descending, index ascending), NaN as -inf: a stable sort."""
    values = torch.nan_to_num(x.float(), nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 4),
    width=st.sampled_from([1, 40, 64, 65, 1000, 32768, 32769, 70001]),
    k=st.integers(1, 64),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    coarse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_top_k_rows_is_the_stable_top_k(rows: int, width: int, k: int, dtype: torch.dtype, coarse: bool,
                                        seed: int) -> None:  # fmt: skip
    """The rescored head's candidates: torch.topk's set, ties (many, with coarse values) to the lower index,
    in ranking order, whatever the thread count."""
    k = min(k, width)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen)
    if coarse:  # few distinct values: ties at the k-th place
        x = torch.round(x * 2)
    x = x.to(dtype)
    got = native_cpu.top_k_rows(x, k)
    assert got.dtype == torch.int64 and got.shape == (rows, k)
    assert torch.equal(got, _top_k_reference(x, k))
    assert torch.equal(x.float().gather(1, got), x.float().topk(k, dim=-1).values)  # torch.topk's values
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(native_cpu.top_k_rows(x, k), got)
    finally:
        torch.set_num_threads(threads)


def test_top_k_rows_ranks_nan_last_and_takes_a_sliced_row() -> None:
    x = torch.tensor([[0.5, float("nan"), 2.0, float("-inf"), 1.0, float("inf")]])
    assert native_cpu.top_k_rows(x, 3).tolist() == [[5, 2, 4]]
    assert native_cpu.top_k_rows(x, 6).tolist() == [[5, 2, 4, 0, 1, 3]]  # NaN and -inf: by index
    wide = torch.randn(2, 300)
    assert torch.equal(native_cpu.top_k_rows(wide[:, :250], 7), _top_k_reference(wide[:, :250], 7))
    with pytest.raises(RuntimeError, match="k must be"):
        native_cpu.top_k_rows(x, 7)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        native_cpu.top_k_rows(x.double(), 1)
