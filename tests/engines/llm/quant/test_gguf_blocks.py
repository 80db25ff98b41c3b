"""GGUF block unpacking against the ``gguf`` package's dequantisers (the independent reference).

Q4_0 / Q4_1 / Q8_0 blocks come from the package's quantisers (ggml's reference rounding) applied to random
floats; Q4_K and Q6_K blocks are random bytes with finite fp16 scales (every byte pattern is a valid
block), so every nibble position and every 6-bit scale/min packing is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from sluice.engines.llm.quant.gguf_blocks import GROUP, affine_int4, dequantize, q8_0_blocks


def quantised_rows(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """``(rows, row_bytes)`` uint8 of ``name`` blocks: quantised random floats, or random valid bytes."""
    qtype = GGMLQuantizationType[name]
    rng = np.random.default_rng(seed)
    if name in ("Q4_0", "Q4_1", "Q8_0"):
        return np.asarray(gguf_quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qtype))
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block_values, block_bytes), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.05, (rows, cols // block_values, 2)).astype(np.float16).view(np.uint8)
    if name == "Q4_K":  # d and dmin lead the block
        raw[..., 0:4] = halves.reshape(rows, -1, 4)
    else:  # Q6_K: d trails the block
        raw[..., -2:] = halves[..., :2]
    return raw.reshape(rows, -1)


def reference(name: str, raw: np.ndarray, cols: int) -> torch.Tensor:
    values = gguf_dequantize(raw, GGMLQuantizationType[name])
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(raw.shape[0], cols))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q4_K"])
def test_affine_int4_is_the_gguf_dequantisation_exactly(name: str) -> None:
    rows, cols = 24, 512
    raw = quantised_rows(name, rows, cols)
    q, scale, offset = affine_int4(GGMLQuantizationType[name].value, torch.from_numpy(raw))
    assert q.dtype == torch.uint8 and q.shape == (rows, cols) and int(q.max()) <= 15
    assert scale.shape == offset.shape == (rows, cols // GROUP)
    values = q.view(rows, -1, GROUP).float() * scale.unsqueeze(-1) + offset.unsqueeze(-1)
    assert torch.equal(values.view(rows, cols), reference(name, raw, cols))  # bit for bit


def test_q8_0_blocks_are_the_gguf_dequantisation_exactly() -> None:
    raw = quantised_rows("Q8_0", 10, 96)
    q, d = q8_0_blocks(torch.from_numpy(raw))
    assert q.dtype == torch.int8 and d.shape == (10, 3)
    assert torch.equal((q.view(10, -1, GROUP).float() * d.unsqueeze(-1)).view(10, 96), reference("Q8_0", raw, 96))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K"])
def test_dequantize_matches_gguf_for_every_type(name: str) -> None:
    raw = quantised_rows(name, 7, 768, seed=3)  # three 256-value blocks a row
    got = dequantize(GGMLQuantizationType[name].value, torch.from_numpy(raw), 768)
    assert torch.equal(got, reference(name, raw, 768))
