"""Packed CPU weights: each form's matmul against the float32 product with the values it stores.

The references are computed independently in float32 from what each form is documented to hold (int4:
``(q - 8) * scale + zero`` with bf16 scales and zero points; int8: ``q * scale`` with a bf16 scale per row),
with the activations rounded to bf16 as the kernels take them. The kernels accumulate in float32 and round
their output to bf16, so results agree to bf16's precision (2^-8 relative), not bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.quant import packed
from sluice.engines.llm.quant.gguf_blocks import GROUP
from sluice.engines.llm.quant.packed import DenseWeight, Int4Weight, Int8Weight


def assert_close_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within bf16 output rounding plus float32 summation-order differences."""
    assert got.shape == want.shape
    tolerance = 2**-7 * want.abs().amax(dim=-1, keepdim=True) + 1e-6
    assert bool(((got.float() - want).abs() <= tolerance).all()), float((got.float() - want).abs().max())


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("rows", [64, 40, 7])  # whole row tiles; padded to 48 / to 16
def test_int4_from_affine_multiplies_by_its_values(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    cols = 96
    q = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.1 + 0.01
    offset = torch.randn(rows, cols // GROUP, generator=gen) * 0.3
    w = Int4Weight.from_affine(q, scale, offset)
    assert (w.out_features, w.in_features) == (rows, cols)
    x = torch.randn(5, cols, generator=gen)
    s, z = bf16(scale), bf16(offset + 8 * scale)  # the kernel's (q - 8) * scale + zero form, in bf16
    values = (q.float() - 8).view(rows, -1, GROUP) * s.unsqueeze(-1) + z.unsqueeze(-1)
    y = w.matmul(x)
    assert y.dtype == torch.bfloat16  # into the next matmul as it is
    assert_close_bf16(y, bf16(x) @ values.view(rows, cols).T)


def test_int4_packs_large_matrices_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of _PACK_ROWS rows (a multiple of 64) pack to the same matrix as one piece."""
    gen = torch.Generator().manual_seed(2)
    source = torch.randn(200, 64, generator=gen)
    whole = Int4Weight.quantize(source)
    monkeypatch.setattr(packed, "_PACK_ROWS", 64)
    chunked = Int4Weight.quantize(source)
    assert torch.equal(whole.packed, chunked.packed) and torch.equal(whole.scale_zero, chunked.scale_zero)


def test_int4_quantize_stays_within_half_a_step() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(48, 128, generator=gen)
    x = torch.eye(128)  # the kernel's product with the identity is W itself (rounded to bf16)
    got = Int4Weight.quantize(w).matmul(x).T
    groups = w.view(48, -1, GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    # half a step of rounding, plus the bf16 rounding of scale, zero point and output
    bound = (step / 2 + 2**-7 * groups.abs().amax(-1)).repeat_interleave(GROUP, dim=1)
    assert bool(((got - w).abs() <= bound).all())


def test_int4_symmetric_quantize_stays_within_half_a_step_without_zero_points() -> None:
    """The ranking head's form: one scale per group, min onto -8 or max onto 7, no value clipped."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(48, 128, generator=gen) + 0.3
    packed = Int4Weight.quantize(w, symmetric=True)
    x = torch.eye(128)
    got = packed.matmul(x).T
    groups = w.view(48, -1, GROUP)
    step = torch.maximum(groups.amin(-1) / -8, groups.amax(-1) / 7)
    bound = (step / 2 + 2**-7 * groups.abs().amax(-1)).repeat_interleave(GROUP, dim=1)
    assert bool(((got - w).abs() <= bound).all())
    if native_cpu.int4_matmul_available():  # Sluice's kernel skips the zero points: only the scales are kept
        assert packed.scale_zero.shape[2] == 1 and not packed.pairs()[..., 1].any()
        assert packed.nbytes == Int4Weight.quantize(w).nbytes - packed.scale_zero.numel() * 2


def test_int8_quantize_never_clips_and_rounds_to_the_nearest_step() -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(33, 80, generator=gen) * torch.logspace(-3, 1, 33).unsqueeze(1)  # rows of any magnitude
    w[5] = 0.0  # an all-zero row gets scale 0
    q = Int8Weight.quantize(w)
    scale = q.scale.float().unsqueeze(1)
    assert bool((scale[:, 0] * 127 >= w.abs().amax(dim=1)).all())  # no value beyond the grid
    assert bool(((q.q.float() * scale - w).abs() <= scale / 2 + 1e-12).all())
    assert torch.equal(q.rows(torch.tensor([5, 0])), torch.stack([torch.zeros(80), q.q[0].float() * scale[0]]))
    x = torch.randn(6, 80, generator=gen)
    assert_close_bf16(q.matmul(x), bf16(x) @ (q.q.float() * scale).T)


def test_dense_bf16_weight() -> None:
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(24, 40, generator=gen)
    d = DenseWeight.convert(w)
    assert d.weight.dtype == torch.bfloat16 and d.nbytes == 24 * 40 * 2
    x = torch.randn(3, 40, generator=gen)
    assert_close_bf16(d.matmul(x), bf16(x) @ bf16(w).T)
    assert torch.equal(d.rows(torch.tensor([[1, 2]])), bf16(w)[[1, 2]].unsqueeze(0))
