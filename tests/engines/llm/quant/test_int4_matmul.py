"""The native int4 matmul (``cpu/native/int4_matmul.cpp``): what ``Int4Weight.matmul`` runs for decode rows,
drafts and the LM head on CPUs with AVX512-BF16.

The reference is independent of the packed layout: the weight rebuilt in float64 from the ``q``, scales and
offsets it was packed from (bf16 scale and zero point, as ``Int4Weight`` holds them), times the activations
rounded to bf16 as the kernel takes them. The kernel sums exact products in float32 and rounds once to bf16,
so it must sit within one bf16 rounding of that product; torch's own int4 kernel is held to the same bar.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.quant.gguf_blocks import GROUP
from sluice.engines.llm.quant.packed import Int4Weight

pytestmark = pytest.mark.usefixtures("needs_native_int4")


def _weight(rows: int, cols: int, seed: int) -> tuple[Int4Weight, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.1 + 0.01
    offset = torch.randn(rows, cols // GROUP, generator=gen) * 0.3 - 8 * scale
    s = scale.to(torch.bfloat16).double()
    z = (offset + 8 * scale).to(torch.bfloat16).double()
    values = ((q.double() - 8).view(rows, -1, GROUP) * s.unsqueeze(-1) + z.unsqueeze(-1)).view(rows, cols)
    return Int4Weight.from_affine(q, scale, offset), values


def _product(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double() @ values.T


def _assert_one_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within a bf16 rounding of each output (2**-8 relative), plus float32 summation slack."""
    err = (got.double() - want).abs()
    bound = want.abs() * 2**-8 + 1e-5 * float(want.abs().max())
    assert bool((err <= bound).all()), f"worst excess {float((err - bound).max()):.3g}"


# whole 64-row tiles, tails of 16 / 32 / 48 rows (the scalar path), padding 200 -> 208, K of one group
@pytest.mark.parametrize(("rows", "cols"), [(64, 64), (16, 96), (96, 64), (112, 128), (200, 256), (64, 32),
                                            (576, 1536), (960, 576)])  # fmt: skip
@pytest.mark.parametrize("m", [1, 3, 4, 5, 9])
def test_matmul_is_the_product_within_one_bf16_rounding(rows: int, cols: int, m: int) -> None:
    w, values = _weight(rows, cols, seed=rows * 7 + cols)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 3
    got = native_cpu.int4_matmul(x.to(torch.bfloat16).contiguous(), w.packed, w.scale_zero)
    assert got.shape == (m, w.packed.shape[0]) and got.dtype == torch.bfloat16
    want = _product(x, values)
    _assert_one_rounding(got[:, :rows], want)
    _assert_one_rounding(torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), w.packed, GROUP,
                                                                    w.scale_zero)[:, :rows], want)  # fmt: skip


def test_int4_weight_matmul_runs_it_and_the_plan_can_restore_torchs_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    w, _ = _weight(200, 128, seed=1)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(2))
    native = native_cpu.int4_matmul(x.to(torch.bfloat16).contiguous(), w.packed, w.scale_zero)[:, :200]
    calls: list[int] = []
    real = native_cpu.int4_matmul
    monkeypatch.setattr(native_cpu, "int4_matmul", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(w.matmul(x), native) and calls  # float32 activations go in as bf16, padding rows cut
    w.native = False  # what the engine sets from kernels.int4_matmul: torch
    calls.clear()
    torch_kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), w.packed, GROUP, w.scale_zero)
    assert torch.equal(w.matmul(x), torch_kernel[:, :200]) and not calls


@settings(max_examples=40, deadline=None)
@given(
    tiles=st.integers(1, 3),
    tail=st.sampled_from([0, 16, 32, 48]),
    groups=st.integers(1, 6),
    m=st.integers(1, 12),
    data=st.data(),
)
def test_a_rows_result_does_not_depend_on_the_other_rows(tiles: int, tail: int, groups: int, m: int,
                                                         data: st.DataObject) -> None:  # fmt: skip
    """What lets the engine batch decode rows, drafts and sampled rows freely: every row alone, or any subset
    in any order, gives bit for bit what it gives among all M rows."""
    rows, cols = 64 * tiles + tail, GROUP * groups
    w, _ = _weight(rows, cols, seed=rows + cols + m)
    x = (torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 2).to(torch.bfloat16)
    whole = native_cpu.int4_matmul(x, w.packed, w.scale_zero)
    subset = data.draw(st.lists(st.integers(0, m - 1), min_size=1, max_size=m))
    part = native_cpu.int4_matmul(x[subset].contiguous(), w.packed, w.scale_zero)
    assert torch.equal(part, whole[subset])
    # the form for CPUs without AVX512-VBMI (Intel Cooper Lake) pairs the bytes otherwise, to the same vectors
    assert torch.equal(native_cpu.int4_matmul(x, w.packed, w.scale_zero, portable=True), whole)


def _q4_0_weight(rows: int, cols: int, seed: int) -> tuple[Int4Weight, torch.Tensor]:
    """A Q4_0-shaped weight, ``w = (q - 8) * d``: every zero point 0."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.1 + 0.01
    s = scale.to(torch.bfloat16).double()
    values = ((q.double() - 8).view(rows, -1, GROUP) * s.unsqueeze(-1)).view(rows, cols)
    return Int4Weight.from_affine(q, scale, -8 * scale), values


@pytest.mark.parametrize(("rows", "cols"), [(64, 64), (16, 96), (112, 128), (200, 256), (960, 576)])
@pytest.mark.parametrize("m", [1, 4, 9])
def test_zero_points_of_0_are_not_kept_and_the_results_are_the_same_bit_for_bit(rows: int, cols: int,
                                                                                m: int) -> None:  # fmt: skip
    """A Q4_0 tensor keeps its scales only (a tenth fewer bytes read) and multiplies exactly as the (scale,
    0) pairs do, in both pairing forms, for whole tiles and tails; torch's kernel gets the pairs back."""
    w, values = _q4_0_weight(rows, cols, seed=rows + cols)
    assert w.scale_zero.shape == (cols // GROUP, w.packed.shape[0], 1)
    assert w.nbytes == w.packed.numel() + w.scale_zero.numel() * 2
    pairs = w.pairs()
    assert pairs.shape[2] == 2 and not pairs[..., 1].any() and torch.equal(pairs[..., 0], w.scale_zero[..., 0])
    x = (torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 3).to(torch.bfloat16)
    scales_only = native_cpu.int4_matmul(x, w.packed, w.scale_zero)
    assert torch.equal(scales_only, native_cpu.int4_matmul(x, w.packed, pairs))
    assert torch.equal(native_cpu.int4_matmul(x, w.packed, w.scale_zero, portable=True), scales_only)
    _assert_one_rounding(scales_only[:, :rows], _product(x, values))


def test_scales_only_fall_back_to_torchs_kernel_when_it_is_turned_off() -> None:
    w, values = _q4_0_weight(200, 128, seed=5)
    assert w.scale_zero.shape[2] == 1
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(6))
    w.native = False
    _assert_one_rounding(w.matmul(x), _product(x, values))


def test_without_scales_only_zero_points_of_0_are_kept() -> None:
    w = Int4Weight.from_affine(*_q4_0_args(64, 64), scales_only=False)
    assert w.scale_zero.shape[2] == 2 and not w.scale_zero[..., 1].any()
    assert Int4Weight.quantize(torch.randn(64, 64) + 1, symmetric=True, scales_only=False
                               ).scale_zero[..., 1].any()  # asymmetric  # fmt: skip


def test_the_engine_packs_as_its_plan_says(smollm2_gguf: Path) -> None:
    from sluice.engines.llm import LLM
    from sluice.engines.llm.model.layers.quantized import QuantizedLinear

    def forms(llm: LLM) -> set[tuple[int, bool]]:
        return {(m.packed.scale_zero.shape[2], m.packed.native) for m in llm.runner.model.modules()
                if isinstance(m, QuantizedLinear) and isinstance(m.packed, Int4Weight)}  # fmt: skip

    assert (1, True) in forms(LLM(smollm2_gguf, kv_cache_memory_bytes=8 << 20))  # its Q4_0 tensors: scales only
    assert forms(LLM(smollm2_gguf, kv_cache_memory_bytes=8 << 20, kernels={"int4_scales_only": False})) == {(2, True)}
    assert forms(LLM(smollm2_gguf, kv_cache_memory_bytes=8 << 20, kernels={"int4_matmul": "torch"})) == {(2, False)}


def _q4_0_args(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (rows, cols), dtype=torch.uint8)
    scale = torch.full((rows, cols // GROUP), 0.05)
    return q, scale, -8 * scale


def test_no_rows_and_refusals() -> None:
    w, _ = _weight(64, 64, seed=0)
    empty = native_cpu.int4_matmul(torch.empty(0, 64, dtype=torch.bfloat16), w.packed, w.scale_zero)
    assert empty.shape == (0, 64)
    with pytest.raises(RuntimeError, match="x must be"):
        native_cpu.int4_matmul(torch.zeros(1, 64), w.packed, w.scale_zero)  # float32
    with pytest.raises(RuntimeError, match="packed must be"):
        native_cpu.int4_matmul(torch.zeros(1, 96, dtype=torch.bfloat16), w.packed, w.scale_zero)  # K differs
    with pytest.raises(RuntimeError, match="scale_zero must be"):
        native_cpu.int4_matmul(torch.zeros(1, 64, dtype=torch.bfloat16), w.packed, w.scale_zero.float())
    with pytest.raises(RuntimeError, match="scale_zero must be"):  # three numbers per group and row
        native_cpu.int4_matmul(torch.zeros(1, 64, dtype=torch.bfloat16), w.packed,
                               torch.cat([w.scale_zero, w.scale_zero[..., :1]], dim=2))  # fmt: skip
