"""Packed experts on the CPU: the grouped call equals each row through its expert's packed matrix, and a
mixture-of-experts layer with packed experts equals the float layer over the same (dequantised) weights."""

from __future__ import annotations

import pytest
import torch

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.layers.moe import PackedStacked, SparseMoE, pack_experts
from sluice.engines.llm.quant.packed import DenseWeight, Int4Weight, Int8Weight, PackedWeight

FORMS = {"int4": Int4Weight.quantize, "int8": Int8Weight.quantize, "bf16": DenseWeight.convert}
CFG = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                  head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32)  # fmt: skip


def _experts(num: int, out: int, inputs: int, form: str, gen: torch.Generator) -> list[PackedWeight]:
    return [FORMS[form](torch.randn(out, inputs, generator=gen) / inputs**0.5) for _ in range(num)]


@pytest.mark.parametrize("form", list(FORMS))
def test_the_grouped_call_is_each_row_through_its_expert(form: str) -> None:
    gen = torch.Generator().manual_seed(0)
    experts = _experts(5, 48, 64, form, gen)
    counts = [3, 0, 7, 1, 0]  # experts 1 and 4 chosen by no row
    ends = torch.tensor(counts).cumsum(0).to(torch.int32)
    rows = torch.randn(sum(counts), 64, generator=gen)
    got = PackedStacked(experts, None).grouped(rows, ends)
    owner = [e for e, c in enumerate(counts) for _ in range(c)]
    want = torch.cat([experts[e].matmul(rows[i : i + 1]).float() for i, e in enumerate(owner)])
    assert got.shape == (sum(counts), 48) and got.dtype == rows.dtype
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


def _float_layer(gen: torch.Generator) -> SparseMoE:
    layer = SparseMoE(CFG)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return layer


@pytest.mark.parametrize("form", ["int8", "bf16"])
def test_a_layer_with_packed_experts_equals_the_float_layer_on_their_values(form: str) -> None:
    """int8 and bf16 dequantise exactly (``rows``): the packed layer may differ only by bf16 activations."""
    gen = torch.Generator().manual_seed(1)
    packed_layer, float_layer = _float_layer(gen), SparseMoE(CFG)
    float_layer.load_state_dict(packed_layer.state_dict())
    packed: dict[str, list[PackedWeight]] = {}
    for name in ("gate_up_proj", "down_proj"):
        stack = getattr(packed_layer.experts, name).weight.detach()
        experts = [FORMS[form](w) for w in stack.unbind(0)]
        packed[f"experts.{name}"] = experts
        with torch.no_grad():  # the float layer gets exactly the packed values
            getattr(float_layer.experts, name).weight.copy_(torch.stack([w.rows(torch.arange(w.out_features))
                                                                         for w in experts]))  # fmt: skip
    pack_experts(packed_layer, packed)
    float_layer.experts.gate_up_proj.finish_loading()
    float_layer.experts.down_proj.finish_loading()
    assert isinstance(packed_layer.experts.gate_up_proj, PackedStacked)
    x = torch.randn(37, 64, generator=gen)
    with torch.no_grad():
        want, got = float_layer(x), packed_layer(x)
    assert float((got - want).abs().max()) < 0.02 * float(want.abs().max())
