"""Dispatch in kernels/__init__.py: which path runs by default, and a path the engine's plan names."""

from __future__ import annotations

import pytest
import torch

from sluice.engines.llm import kernels
from sluice.engines.llm.kernels import reference
from sluice.engines.llm.kernels.synthetic import Layout, make_batch


def test_cpu_tensors_take_the_torch_path() -> None:
    assert kernels.kernel_path(torch.zeros(1)) == "torch"


def test_a_named_path_runs_that_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = reference.paged_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reference, "paged_attention", spy)
    kernels._load.cache_clear()
    batch = make_batch(Layout((1,), (5,), 2, 1, 16), num_blocks=4)
    try:
        kernels.paged_attention(*batch.args())  # the default: torch
        assert calls == []
        kernels.paged_attention(*batch.args(), path="reference")
    finally:
        kernels._load.cache_clear()
    assert calls == [1]


def test_dispatched_ops_store_then_attend() -> None:
    layout = Layout((3, 1), (3, 9), 9, 3, 64)
    batch = make_batch(layout, num_blocks=32, seed=4)
    key, value = torch.randn(4, 3, 64), torch.randn(4, 3, 64)
    starts = [0, 3]
    slots = []  # the new tokens sit at the last q_len positions of each sequence
    for s, (q_len, kv_len) in enumerate(zip(layout.q_lens, layout.kv_lens, strict=True)):
        for pos in range(kv_len - q_len, kv_len):
            slots.append(int(batch.block_tables[s, pos // 16]) * 16 + pos % 16)
    k_ref, v_ref = batch.k_cache.clone(), batch.v_cache.clone()
    kernels.store_kv(key, value, batch.k_cache, batch.v_cache, torch.tensor(slots, dtype=torch.int32))
    reference.store_kv(key, value, k_ref, v_ref, torch.tensor(slots))
    assert torch.equal(batch.k_cache, k_ref) and starts == batch.query_start_loc.tolist()[:2]
    got = kernels.paged_attention(*batch.args())
    expected = reference.paged_attention(batch.query, k_ref, v_ref, *batch.args()[3:])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)
