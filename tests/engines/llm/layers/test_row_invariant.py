"""Dense matmuls give a row the same bits whatever else is in the call (``model/layers/row_invariant.py``).

Each layer is applied to a block of rows once (the reference), then to every run of 1..40 of those rows,
starting at several offsets, on 1 to 4 threads: each row must come out bit-identical to its reference. The
layers: a float32 ``RowInvariantLinear`` at SmolLM2's and Llama-3.2-1B's projection widths, a bf16
``DenseWeight``, and the rescoring of a GGUF LM head. The plain layers they replace are checked to be
exact to float rounding against the same weights (the padding changes which kernel runs, not the maths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from sluice.engines.llm.model.layers.row_invariant import RowInvariantLinear, make_row_invariant, padded_rows
from sluice.engines.llm.quant.packed import DenseWeight

Layer = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _rows_that_changed(layer: Layer, in_features: int, max_rows: int = 40) -> list[tuple[int, int, int]]:
    """(threads, rows, offset) of every call whose rows differ from the same rows computed in one block."""
    x = torch.randn(max_rows + 8, in_features, generator=torch.Generator().manual_seed(3))
    torch.set_num_threads(1)
    with torch.inference_mode():
        reference = layer(x)
        changed = []
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            for rows in range(1, max_rows + 1):
                for offset in (0, 1, 5):
                    if not torch.equal(layer(x[offset : offset + rows]), reference[offset : offset + rows]):
                        changed.append((threads, rows, offset))
    return changed


def _linear(in_features: int, out_features: int) -> nn.Linear:
    torch.manual_seed(in_features)
    layer = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
    return layer


@pytest.mark.parametrize(("in_features", "out_features"), [(576, 1536), (2048, 3072)])
def test_float32_linear_rows_do_not_depend_on_the_call(in_features: int, out_features: int) -> None:
    plain = _linear(in_features, out_features)
    model = nn.Sequential(_linear(in_features, out_features))
    assert make_row_invariant(model) == 1 and type(model[0]) is RowInvariantLinear
    assert _rows_that_changed(model[0], in_features) == []
    x = torch.randn(3, in_features)
    torch.testing.assert_close(model[0](x), plain(x), rtol=1e-4, atol=1e-4)
    if torch.backends.mkldnn.is_available():  # prepacked for oneDNN; the dense copy dropped
        assert model[0].onednn_weight is not None and model[0].weight.numel() == 0


def test_a_tied_weight_is_kept_for_the_module_that_shares_it() -> None:
    model = nn.ModuleDict({"embed": nn.Embedding(64, 32), "head": nn.Linear(32, 64, bias=False)})
    model["head"].weight = model["embed"].weight
    make_row_invariant(model)
    assert model["head"].weight is model["embed"].weight and model["embed"].weight.shape == (64, 32)
    x = torch.randn(5, 32)
    torch.testing.assert_close(model["head"](x), x @ model["embed"].weight.T, rtol=1e-4, atol=1e-4)


def test_bf16_dense_weight_rows_do_not_depend_on_the_call() -> None:
    weight = DenseWeight.convert(torch.randn(1536, 576, generator=torch.Generator().manual_seed(1)) * 0.05)
    holder = nn.Module()
    holder.packed = weight  # type: ignore[assignment]
    assert make_row_invariant(holder) == 1 and weight.row_invariant
    assert _rows_that_changed(weight.matmul, 576) == []


def test_padding_is_a_multiple_of_four() -> None:
    assert [padded_rows(n) for n in (1, 3, 4, 5, 8, 9, 511)] == [4, 4, 4, 8, 8, 12, 512]


def test_a_rescored_head_scores_each_row_alone() -> None:
    from sluice.engines.llm.model.layers.quantized import RescoredHead

    class Rows:  # the exact head's rows, as GGUFRows.gather gives them
        shape = (4096, 576)

        def __init__(self) -> None:
            self.table = torch.randn(4096, 576, generator=torch.Generator().manual_seed(2))

        def gather(self, ids: torch.Tensor) -> torch.Tensor:
            return self.table[ids]

    exact = Rows()
    fast = nn.Linear(576, 4096, bias=False)
    with torch.no_grad():
        fast.weight.copy_(exact.table.bfloat16().float())
    head = RescoredHead(fast, exact)  # type: ignore[arg-type]
    make_row_invariant(head)  # its packed pass, as in a model
    assert _rows_that_changed(head, 576, max_rows=12) == []
    h = torch.randn(2, 576)
    logits = head(h)
    top = logits.topk(3).indices
    torch.testing.assert_close(logits.gather(1, top), (exact.table[top] * h.unsqueeze(1)).sum(-1))


def test_int4_dense_prompt_rows_do_not_depend_on_the_call() -> None:
    """The dense bf16 GEMM that prompt rows of int4 projections take where Sluice's int4 kernel is not built."""
    from sluice.engines.llm.quant import int4_dense
    from sluice.engines.llm.quant.packed import Int4Weight

    weight = Int4Weight.quantize(torch.randn(1536, 576, generator=torch.Generator().manual_seed(4)) * 0.05)
    if not int4_dense.available(torch.zeros(1, 576)):
        pytest.skip("the native kernels are not built here")
    assert _rows_that_changed(lambda x: int4_dense.dense_matmul(weight, x), 576) == []
