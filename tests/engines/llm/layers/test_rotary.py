"""Rotary tables against HF transformers' rotary modules, for every scaling variant and partial rotary.

HF computes cos/sin per forward pass from ``position_ids``; the dynamic and LongRoPE variants change their
frequencies with the longest position of the pass. The tables Sluice precomputes must hold, row by row,
what HF computes for a token at that position: decoding one token at a time for dynamic NTK; a whole
sequence shorter / longer than the original context for LongRoPE's short / long rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sluice.engines.llm.model.families.common import hf_rope
from sluice.engines.llm.model.layers.rotary import apply_rotary, rope_tables

MAX_LEN = 96
HEAD_DIM = 16


def _hf_rotary(model_type: str, **config: Any) -> tuple[Any, torch.nn.Module]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                               intermediate_size=128, num_hidden_layers=1, **config)  # fmt: skip
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}", fromlist=["x"])
    rotary_cls = getattr(module, f"{type(cfg).__name__.removesuffix('Config')}RotaryEmbedding")
    return cfg, rotary_cls(cfg)


def _hf_rows(rotary: torch.nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, positions.shape[-1], HEAD_DIM)
    cos, sin = rotary(x, positions.view(1, -1))
    return cos[0], sin[0]


CASES = {
    "default": ("llama", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "linear": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama3": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                                  original_max_position_embeddings=32))),
    "yarn": ("qwen2", dict(rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                                original_max_position_embeddings=32))),
    "partial-default": ("phi3", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                          partial_rotary_factor=0.5))),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_static_tables_equal_hf(case: str) -> None:
    model_type, config = CASES[case]
    cfg, rotary = _hf_rotary(model_type, max_position_embeddings=MAX_LEN, **config)
    rope = hf_rope(cfg.to_dict())
    assert rope.scaling == config["rope_parameters"]["rope_type"]
    cos, sin = rope_tables(rope, HEAD_DIM, MAX_LEN, MAX_LEN)
    hf_cos, hf_sin = _hf_rows(rotary, torch.arange(MAX_LEN))
    assert torch.equal(cos, hf_cos) and torch.equal(sin, hf_sin)


def test_dynamic_ntk_rows_equal_hf_decoding_one_token_at_a_time() -> None:
    cfg, rotary = _hf_rotary("llama", max_position_embeddings=32,
                             rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))  # fmt: skip
    rope = hf_rope(cfg.to_dict())
    cos, sin = rope_tables(rope, HEAD_DIM, 32, MAX_LEN)
    for p in range(MAX_LEN):  # HF grows its base when a pass reaches past the trained length
        hf_cos, hf_sin = _hf_rows(rotary, torch.tensor([p]))
        assert torch.equal(cos[p], hf_cos[0]) and torch.equal(sin[p], hf_sin[0]), p
    assert not torch.equal(cos[40], rope_tables(hf_rope({"rope_theta": 10000.0}), HEAD_DIM, 32, MAX_LEN)[0][40])


def test_longrope_short_and_long_rows_equal_hf() -> None:
    factors = dict(short_factor=[1.0, 1.1, 1.3, 2.0], long_factor=[1.0, 2.0, 4.0, 8.0])
    cfg, rotary = _hf_rotary("phi3", max_position_embeddings=MAX_LEN, original_max_position_embeddings=32,
                             rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                  partial_rotary_factor=0.5, **factors))  # fmt: skip
    rope = hf_rope(cfg.to_dict())
    cos, sin = rope_tables(rope, HEAD_DIM, MAX_LEN, MAX_LEN)
    assert cos.shape == (2 * MAX_LEN, 8)  # short rows, then long rows; 8 of 16 dims rotated
    short_cos, short_sin = _hf_rows(rotary, torch.arange(32))  # a pass within the original context
    assert torch.equal(cos[:32], short_cos) and torch.equal(sin[:32], short_sin)
    long_cos, long_sin = _hf_rows(rotary, torch.arange(MAX_LEN))  # a pass past it: long factors everywhere
    assert torch.equal(cos[MAX_LEN:], long_cos) and torch.equal(sin[MAX_LEN:], long_sin)


def test_partial_rotary_leaves_the_other_dims_alone() -> None:
    x = torch.randn(5, 3, HEAD_DIM)
    rope = hf_rope({"rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    cos, sin = rope_tables(rope, HEAD_DIM, 2048, 8)
    y = apply_rotary(x, cos[3:8].unsqueeze(1), sin[3:8].unsqueeze(1))
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert not torch.allclose(y[..., :8], x[..., :8])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps each head's length
