"""The compiled Triton kernels on a real GPU (skipped without CUDA), including bf16."""

from __future__ import annotations

import pytest
import torch

from sluice.engines.llm.kernels import reference
from sluice.engines.llm.kernels.synthetic import LAYOUTS, WINDOWED_LAYOUTS, Layout, make_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOLERANCES = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS + WINDOWED_LAYOUTS, ids=lambda layout: layout.name)
def test_attention_matches_reference_on_gpu(layout: Layout, dtype: torch.dtype) -> None:
    from sluice.engines.llm.kernels.triton_paged_attention import paged_attention

    batch = make_batch(layout, dtype=dtype, poison_unused=True)
    expected = reference.paged_attention(*batch.args(), **batch.options())
    gpu = make_batch(layout, dtype=dtype, poison_unused=True, device="cuda")
    got = paged_attention(*gpu.args(), out=torch.full_like(gpu.query, float("nan")), **gpu.options())
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_store_kv_matches_reference_on_gpu(dtype: torch.dtype) -> None:
    from sluice.engines.llm.kernels.triton_store_kv import store_kv

    gen = torch.Generator().manual_seed(1)
    key, value = torch.randn(64, 3, 64, generator=gen).to(dtype), torch.randn(64, 3, 64, generator=gen).to(dtype)
    slots = torch.randperm(4000 * 16, generator=gen)[:64]
    slots[::9] = -1
    k_ref, v_ref = torch.zeros(4000, 16, 3, 64, dtype=dtype), torch.zeros(4000, 16, 3, 64, dtype=dtype)
    reference.store_kv(key, value, k_ref, v_ref, slots)
    k_gpu, v_gpu = k_ref.new_zeros(k_ref.shape, device="cuda"), v_ref.new_zeros(v_ref.shape, device="cuda")
    store_kv(key.cuda(), value.cuda(), k_gpu, v_gpu, slots.to("cuda", torch.int32))
    assert torch.equal(k_gpu.cpu(), k_ref) and torch.equal(v_gpu.cpu(), v_ref)
