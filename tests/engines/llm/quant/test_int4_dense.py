"""The dense path of int4 weights (``quant/int4_dense.py``, native ``int4_unpack``) and the prompt-row routing.

References are independent of torch's packed layout: the weight is rebuilt in float32 from the ``q``,
scales and offsets it was packed from (``(q - 8) * scale + zero`` with bf16 scales and zero points, as
``Int4Weight`` documents). The engine-level tests check what the routing promises a user: a prompt's output
does not depend on how it was chunked, cached or batched, and it agrees with the all-int4-kernel path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.cpu import int4_layout, native_cpu
from sluice.engines.llm.model.layers.quantized import QuantizedLinear, RowSplit, StepRows
from sluice.engines.llm.quant import int4_dense
from sluice.engines.llm.quant.gguf_blocks import GROUP
from sluice.engines.llm.quant.packed import Int4Weight


def _weight(rows: int, cols: int, seed: int) -> tuple[Int4Weight, torch.Tensor]:
    """A packed weight and its values in float32 (bf16 scales and zero points, as the layout holds them)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.1 + 0.01
    offset = torch.randn(rows, cols // GROUP, generator=gen) * 0.3
    s = scale.to(torch.bfloat16).float()
    z = (offset + 8 * scale).to(torch.bfloat16).float()
    values = ((q.float() - 8).view(rows, -1, GROUP) * s.unsqueeze(-1) + z.unsqueeze(-1)).view(rows, cols)
    return Int4Weight.from_affine(q, scale, offset), values


def test_the_unpack_kernel_builds_here() -> None:
    assert native_cpu.usable()


@pytest.mark.parametrize(("rows", "cols"), [(64, 64), (16, 96), (80, 64), (200, 128), (1000, 32)])
def test_unpack_gives_the_weight_rounded_to_bf16(rows: int, cols: int) -> None:
    """Whole 64-row tiles, a tail of 16 / 48 rows, padding (200 -> 208), a slice that starts mid-matrix."""
    w, values = _weight(rows, cols, seed=rows + cols)
    padded = w.packed.shape[0]
    out = torch.empty(cols, padded, dtype=torch.bfloat16)  # W.T
    native_cpu.int4_unpack(w.packed, w.scale_zero, 0, out)
    got, want = out.T[:rows], values.to(torch.bfloat16)
    assert float((got.float() - values).abs().max()) <= 2**-8 * float(values.abs().max())
    assert (got == want).float().mean() > 0.999  # only fma-vs-mul+add ties may round the other way
    if padded > 128:
        part = torch.empty(cols, padded - 64, dtype=torch.bfloat16)
        native_cpu.int4_unpack(w.packed, w.scale_zero, 64, part)
        assert torch.equal(part, out[:, 64:])


@pytest.mark.parametrize("rows", [16, 48, 80, 112, 208])
def test_the_layout_found_is_the_one_torch_packs_here(rows: int) -> None:
    """torch's packing depends on the CPU capability it dispatches to; Sluice reads what it finds."""
    layout = int4_layout.torch_layout()
    expected = {"AVX512": int4_layout.AVX512, "AVX2": int4_layout.AVX2, "DEFAULT": int4_layout.PAIRS}
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in expected:
        assert layout == expected[capability]
    q = torch.randint(0, 16, (rows, 64), generator=torch.Generator().manual_seed(rows), dtype=torch.int32)
    assert torch.equal(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), int4_layout.pack(q, layout))


@pytest.mark.parametrize("layout", int4_layout.KNOWN, ids=["avx512", "avx2", "pairs"])
@pytest.mark.parametrize("rows", [64, 80, 112, 208])
def test_unpack_reads_every_layout_torch_may_pack_in(layout: int4_layout.Int4Layout, rows: int) -> None:
    """Whatever the machine, each layout is unpacked to the same weight (packed here in Python)."""
    w, values = _weight(rows, 96, seed=rows)
    q = torch.randint(0, 16, (rows, 96), generator=torch.Generator().manual_seed(rows + 1), dtype=torch.uint8)
    scale_zero = w.scale_zero[:, :rows].contiguous()
    s, z = scale_zero[..., 0].T.float(), (scale_zero[..., 1].T.float() if scale_zero.shape[2] == 2 else 0.0)
    want = ((q.float() - 8).view(rows, -1, GROUP) * s.unsqueeze(-1) + torch.as_tensor(z).unsqueeze(-1)
            ).view(rows, 96).to(torch.bfloat16)  # fmt: skip
    out = torch.empty(96, rows, dtype=torch.bfloat16)
    native_cpu.int4_unpack(int4_layout.pack(q, layout), scale_zero, 0, out, layout)
    assert (out.T == want).float().mean() > 0.999  # only fma-vs-mul+add ties may round the other way
    if rows > 64:
        part = torch.empty(96, rows - 64, dtype=torch.bfloat16)
        native_cpu.int4_unpack(int4_layout.pack(q, layout), scale_zero, 64, part, layout)
        assert torch.equal(part, out[:, 64:])


def test_unpack_reads_scales_only_as_scale_and_zero_point_0() -> None:
    """A Q4_0 weight (scales only, where Sluice's kernel runs) unpacks as its (scale, 0) pairs do."""
    q = torch.randint(0, 16, (208, 128), generator=torch.Generator().manual_seed(9), dtype=torch.uint8)
    scale = torch.rand(208, 4, generator=torch.Generator().manual_seed(10)) * 0.1 + 0.01
    w = Int4Weight.from_affine(q, scale, -8 * scale)
    if w.scale_zero.shape[2] != 1:
        pytest.skip("scales-only weights are kept only where Sluice's int4 kernel runs (AVX512-BF16)")
    scales_only, pairs = (torch.empty(128, 208, dtype=torch.bfloat16) for _ in range(2))
    native_cpu.int4_unpack(w.packed, w.scale_zero, 0, scales_only)
    native_cpu.int4_unpack(w.packed, w.pairs(), 0, pairs)
    assert torch.equal(scales_only, pairs)
    assert torch.equal(scales_only.T.float(), ((q.float() - 8).view(208, 4, GROUP) * scale.to(torch.bfloat16)
                                               .float().unsqueeze(-1)).view(208, 128).to(torch.bfloat16).float())  # fmt: skip


def test_unpack_refuses_what_it_cannot_read() -> None:
    w, _ = _weight(128, 64, seed=0)
    with pytest.raises(RuntimeError, match="start on a block of the layout"):
        native_cpu.int4_unpack(w.packed, w.scale_zero, 16, torch.empty(64, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="rows out of range"):
        native_cpu.int4_unpack(w.packed, w.scale_zero, 64, torch.empty(64, 128, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="out must be"):
        native_cpu.int4_unpack(w.packed, w.scale_zero, 0, torch.empty(32, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("rows", [1, 2, 37])
def test_dense_matmul_agrees_with_the_int4_kernel_and_the_float_product(rows: int) -> None:
    w, values = _weight(136, 256, seed=rows)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(7))
    want = x.to(torch.bfloat16).float() @ values.T
    got = int4_dense.dense_matmul(w, x)
    assert got.shape == (rows, 136) and got.dtype == torch.bfloat16
    scale = want.abs().amax()
    assert float((got.float() - want).abs().max()) <= 2**-6 * float(scale)  # bf16 weights + bf16 output
    assert float((got.float() - w.matmul(x).float()).abs().max()) <= 2**-6 * float(scale)


def test_slices_do_not_change_the_product(monkeypatch: pytest.MonkeyPatch) -> None:
    w, _ = _weight(400, 128, seed=3)  # 400 rows, padded to 400 (a multiple of 16), tail of 16
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(1))
    whole = int4_dense.dense_matmul(w, x)
    monkeypatch.setattr(int4_dense, "SLICE_BYTES", 64 * 128 * 2)  # one tile per slice
    assert int4_dense.slice_rows(128) == 64
    assert torch.equal(int4_dense.dense_matmul(w, x), whole)


@settings(max_examples=25, deadline=None)
@given(num_rows=st.integers(1, 70), data=st.data())
def test_a_rows_result_does_not_depend_on_the_other_rows(num_rows: int, data: st.DataObject) -> None:
    """What makes a prompt's KV independent of its chunking: any subset of rows gives the same rows."""
    w, _ = _weight(192, 192, seed=11)
    x = torch.randn(num_rows, 192, generator=torch.Generator().manual_seed(num_rows))
    full = int4_dense.dense_matmul(w, x)
    subset = sorted(set(data.draw(st.lists(st.integers(0, num_rows - 1), min_size=1, max_size=num_rows))))
    assert torch.equal(int4_dense.dense_matmul(w, x[subset]), full[subset])


def test_a_linear_layer_routes_prompt_rows_and_keeps_the_others_on_the_int4_kernel() -> None:
    w, _ = _weight(128, 96, seed=5)
    rows = StepRows()
    layer = QuantizedLinear(w, None, rows=rows)
    head = QuantizedLinear(w, None)  # the LM head: built without the step's rows
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(2))
    split = RowSplit.of([True, False, True, True, False, False])
    assert split is not None and RowSplit.of([False] * 3) is None
    rows.split = split  # what CausalLM.forward does for a step's prompt rows
    routed, unrouted = layer(x), head(x)
    rows.split = None
    dense, kernel = int4_dense.dense_matmul(w, x), w.matmul(x)
    assert torch.equal(routed[split.dense], dense[split.dense])
    assert torch.equal(routed[split.rest], kernel[split.rest])
    assert torch.equal(unrouted, kernel)
    assert torch.equal(layer(x), kernel)  # outside a step: nothing routed


# ---- the engine ---------------------------------------------------------------------------------------


def _greedy(llm: LLM, prompts: list[str], n: int = 12) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=n))]


PROMPTS = [
    "Label the sentiment of this review as positive or negative: the battery died after two days.",
    "Extract the city from: 'Shipped from Lyon to a customer in Porto on Monday.' City:",
    "Write one sentence about the sea.",
]


@pytest.mark.parametrize("mode", ["on", "auto"])  # prompt rows dense; the default (the kernel, where it is built)
def test_prompt_outputs_do_not_depend_on_chunking_or_the_prefix_cache(mode: str, smollm2_gguf: Path) -> None:
    """Chunked prefill in pieces of 16 tokens (every chunk a few prompt rows beside other requests' decode rows),
    one whole-prompt step each, and a second pass served from the prefix cache: the same tokens with the same
    log-probabilities, bit for bit -- the projections are row-invariant and attention reads every row's keys
    in one order (``attention.py``), so nothing about the batch reaches a row's numbers."""
    params = SamplingParams(max_tokens=6, logprobs=True)
    dense = {"int4_dense_prompts": mode}
    chunked = LLM(smollm2_gguf, kv_cache_memory_bytes=32 << 20, max_num_batched_tokens=16, kernels=dense)
    assert chunked.runner.routes_prompt_rows == (mode == "on" or not native_cpu.int4_matmul_available())
    first = chunked.generate(PROMPTS, params)
    cached = chunked.generate(PROMPTS, params)  # served from the prefix cache
    whole = LLM(smollm2_gguf, kv_cache_memory_bytes=32 << 20, max_num_batched_tokens=512, enable_prefix_caching=False,
                kernels=dense)
    alone = [whole.generate([p], params)[0] for p in PROMPTS]  # one request at a time: other step shapes
    for a, b, c in zip(first, cached, alone, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.logprobs == b.logprobs == c.logprobs


def test_dense_prompts_agree_with_the_int4_kernel(smollm2_gguf: Path) -> None:
    """The dense path changes each weight by one bf16 rounding: the prompt's next token and its log-probability
    stay those of the all-int4 path."""
    params = SamplingParams(max_tokens=1, logprobs=True)
    dense_llm = LLM(smollm2_gguf, kv_cache_memory_bytes=32 << 20, kernels={"int4_dense_prompts": "on"})
    assert dense_llm.runner.routes_prompt_rows
    dense = dense_llm.generate(PROMPTS, params)
    kernel_llm = LLM(smollm2_gguf, kv_cache_memory_bytes=32 << 20, kernels={"int4_dense_prompts": "off"})
    assert not kernel_llm.runner.routes_prompt_rows
    kernel = kernel_llm.generate(PROMPTS, params)
    for a, b in zip(dense, kernel, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs is not None and b.logprobs is not None
        assert abs(a.logprobs[0] - b.logprobs[0]) < 0.05
