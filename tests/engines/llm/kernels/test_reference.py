"""The reference itself, checked on cases small enough to compute by hand-written dense attention."""

from __future__ import annotations

import math

import pytest
import torch

from sluice.engines.llm.kernels import reference
from sluice.engines.llm.kernels.synthetic import Layout, make_batch


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:  # fmt: skip
    """Causal attention of q (q_len, d) at the end of k/v (kv_len, d), one head, scalar loops: row j sees
    positions pos - window < i <= pos; scores are softcap * tanh(score / softcap) when capped."""
    q_len, kv_len = q.shape[0], k.shape[0]
    out = torch.zeros_like(q)
    for j in range(q_len):
        pos = kv_len - q_len + j
        first = 0 if window is None else max(0, pos - window + 1)
        scores = [float(q[j] @ k[i]) * scale for i in range(pos + 1)]
        if softcap is not None:
            scores = [softcap * math.tanh(s / softcap) for s in scores]
        weights = [math.exp(s) if i >= first else 0.0 for i, s in enumerate(scores)]
        total = sum(weights)
        for i, w in enumerate(weights):
            out[j] += w / total * v[i]
    return out


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (None, 1.5), (4, 2.0)],
                         ids=["causal", "window3", "softcap1.5", "window4-softcap2"])  # fmt: skip
def test_reference_attention_matches_dense_attention_per_head(window: int | None, softcap: float | None) -> None:
    layout = Layout((1, 4), (6, 9), num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                    sliding_window=window, softcap=softcap)  # fmt: skip
    batch = make_batch(layout, num_blocks=40, seed=3)
    out = reference.paged_attention(*batch.args(), **batch.options())
    starts = batch.query_start_loc.tolist()
    for s, kv_len in enumerate(layout.kv_lens):
        n = -(-kv_len // layout.block_size)
        blocks = batch.block_tables[s, :n].long()
        k = batch.k_cache[blocks].reshape(-1, 2, 8)[:kv_len]
        v = batch.v_cache[blocks].reshape(-1, 2, 8)[:kv_len]
        for h in range(4):
            q = batch.query[starts[s]:starts[s + 1], h]
            expected = _dense_attention(q, k[:, h // 2], v[:, h // 2], batch.scale, window, softcap)
            torch.testing.assert_close(out[starts[s]:starts[s + 1], h], expected, atol=1e-5, rtol=1e-5)


def test_reference_store_kv_writes_slots_and_skips_negative_ones() -> None:
    k_cache = torch.zeros(4, 2, 1, 3)
    v_cache = torch.zeros(4, 2, 1, 3)
    key = torch.arange(9.0).view(3, 1, 3) + 1
    reference.store_kv(key, -key, k_cache, v_cache, torch.tensor([7, -1, 0]))
    assert torch.equal(k_cache[3, 1, 0], key[0, 0]) and torch.equal(v_cache[3, 1, 0], -key[0, 0])
    assert torch.equal(k_cache[0, 0, 0], key[2, 0])
    assert int((k_cache != 0).sum()) == 6  # only the two stored tokens' 3 values each
