"""The vectorised CPU path against the reference on ragged mixed prefill + decode batches."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm.kernels import reference, torch_ops
from sluice.engines.llm.kernels.synthetic import LAYOUTS, WINDOWED_LAYOUTS, Layout, make_batch

TOLERANCES = {torch.float32: 2e-5, torch.float16: 4e-3}
ONE_SEQ_PER_CHUNK = 1  # a CHUNK_BYTES that puts every sequence in a chunk of its own


@pytest.mark.parametrize("chunk_bytes", [ONE_SEQ_PER_CHUNK, torch_ops.CHUNK_BYTES], ids=["chunk1", "chunkdefault"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_attention_matches_reference(layout: Layout, dtype: torch.dtype, chunk_bytes: int) -> None:
    batch = make_batch(layout, dtype=dtype)
    with mock.patch.object(torch_ops, "CHUNK_BYTES", chunk_bytes):
        expected = reference.paged_attention(*batch.args())
        out = torch.full_like(batch.query, float("nan"))  # rows the op forgets to write stay NaN
        got = torch_ops.paged_attention(*batch.args(), out=out)
    assert got is out and got.dtype == dtype
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("chunk_bytes", [ONE_SEQ_PER_CHUNK, torch_ops.CHUNK_BYTES], ids=["chunk1", "chunkdefault"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", WINDOWED_LAYOUTS, ids=lambda layout: layout.name)
def test_windowed_and_softcapped_attention_matches_reference(layout: Layout, dtype: torch.dtype,
                                                             chunk_bytes: int) -> None:  # fmt: skip
    batch = make_batch(layout, dtype=dtype)
    with mock.patch.object(torch_ops, "CHUNK_BYTES", chunk_bytes):
        expected = reference.paged_attention(*batch.args(), **batch.options())
        got = torch_ops.paged_attention(*batch.args(), **batch.options())
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    # the window and the cap change the result: the test would notice them being ignored
    assert not torch.allclose(got.float(), reference.paged_attention(*batch.args()).float(), atol=10 * tol)


def test_attention_ignores_block_table_padding_and_stale_blocks() -> None:
    layout = Layout((1, 3), (20, 35), 9, 3, 64)
    batch = make_batch(layout, seed=5)
    before = torch_ops.paged_attention(*batch.args())
    batch.block_tables[:, -1] = 17  # padding entries point to some other (finite, stale) block
    batch.k_cache[batch.block_tables[0, 1], 4:] = 1e3  # the unused tail of sequence 0's last block
    torch.testing.assert_close(torch_ops.paged_attention(*batch.args()), before)


@st.composite
def _layouts(draw: st.DrawFn) -> Layout:
    num_heads, num_kv_heads = draw(st.sampled_from([(9, 3), (4, 4), (8, 1), (6, 2)]))
    num_seqs = draw(st.integers(1, 6))
    q_lens = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 1, 2, 7, 16, 40]), min_size=num_seqs,
                                 max_size=num_seqs)))
    contexts = draw(st.lists(st.integers(0, 200), min_size=num_seqs, max_size=num_seqs))
    kv_lens = tuple(max(1, q + c) for q, c in zip(q_lens, contexts, strict=True))
    return Layout(q_lens, kv_lens, num_heads, num_kv_heads, draw(st.sampled_from([16, 32, 64])),
                  draw(st.sampled_from([1, 4, 16])), sliding_window=draw(st.sampled_from([None, None, 1, 3, 17, 64])),
                  softcap=draw(st.sampled_from([None, None, 1.5, 30.0])))


@settings(max_examples=40, deadline=None)
@given(layout=_layouts(), seed=st.integers(0, 2**16), chunk_bytes=st.sampled_from([1, 100_000, 1 << 30]))
def test_attention_matches_reference_on_random_ragged_layouts(layout: Layout, seed: int, chunk_bytes: int) -> None:
    batch = make_batch(layout, num_blocks=256, seed=seed)
    expected = reference.paged_attention(*batch.args(), **batch.options())
    with mock.patch.object(torch_ops, "CHUNK_BYTES", chunk_bytes):
        got = torch_ops.paged_attention(*batch.args(), **batch.options())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_store_kv_matches_reference_and_skips_negative_slots(dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, num_kv_heads, head_dim = 1500, 16, 3, 64
    qkv = torch.randn(40, (9 + 2 * 3) * head_dim, generator=gen).to(dtype)  # a fused QKV projection
    key = qkv[:, 9 * head_dim:12 * head_dim].view(40, num_kv_heads, head_dim)  # strided views
    value = qkv[:, 12 * head_dim:].view(40, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:40]
    slots[::7] = -1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kv(key, value, k_ref, v_ref, slots)
    torch_ops.store_kv(key, value, k_cache, v_cache, slots.to(slot_dtype))
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    written = slots[slots >= 0]
    assert torch.equal(k_cache.view(-1, num_kv_heads, head_dim)[written], key[slots >= 0])


def test_store_kv_then_attention_sees_the_new_tokens() -> None:
    """A decode step end to end: the new token's K/V, stored through slot_mapping, shapes the output."""
    layout = Layout((1,), (33,), 4, 4, 32)
    batch = make_batch(layout, num_blocks=64, seed=2)
    last_block = int(batch.block_tables[0, 2])
    slot = torch.tensor([last_block * 16 + 0])  # position 32 = offset 0 of the third block
    key = batch.query.clone()  # a key equal to the query dominates the softmax
    value = torch.full_like(batch.query, 7.0)
    torch_ops.store_kv(key, value, batch.k_cache, batch.v_cache, slot)
    out = torch_ops.paged_attention(batch.query * 50, *batch.args()[1:])
    torch.testing.assert_close(out, torch.full_like(out, 7.0), atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS + WINDOWED_LAYOUTS, ids=lambda layout: layout.name)
def test_attention_sinks_match_reference(layout: Layout, dtype: torch.dtype) -> None:
    """gpt-oss's sinks: a per-head logit in every row's softmax, through the decode and prefill paths."""
    batch = make_batch(layout, dtype=dtype, seed=3)
    sinks = torch.randn(batch.query.shape[1], generator=torch.Generator().manual_seed(1)) * 2
    options = {**batch.options(), "sinks": sinks}
    expected = reference.paged_attention(*batch.args(), **options)
    got = torch_ops.paged_attention(*batch.args(), **options)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    without = reference.paged_attention(*batch.args(), **batch.options())
    assert not torch.allclose(got.float(), without.float(), atol=10 * tol)  # the sinks took some attention


def test_a_sink_far_above_every_score_takes_all_attention() -> None:
    batch = make_batch(LAYOUTS[0], seed=4)
    sinks = torch.full((batch.query.shape[1],), 1e4)
    out = reference.paged_attention(*batch.args(), sinks=sinks)
    assert out.abs().max() < 1e-6 and torch.equal(torch_ops.paged_attention(*batch.args(), sinks=sinks), out)
