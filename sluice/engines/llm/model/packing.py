"""How a checkpoint's matrices become packed modules of a :class:`~sluice.engines.llm.model.causal_lm.CausalLM`:
a tied LM head and embedding table, stacked experts, and the swap of an ``nn.Linear`` / ``nn.Embedding`` for
its packed counterpart (the forms themselves: ``quant/policy.py``)."""

from __future__ import annotations

import torch
from torch import nn

from sluice.engines.llm.model.layers.quantized import QuantizedEmbedding, QuantizedLinear, StepRows
from sluice.engines.llm.quant.gguf_rows import ExpertRows, GGUFRows, Loaded
from sluice.engines.llm.quant.packed import PackedWeight
from sluice.engines.llm.quant.policy import (
    Materialized,
    Source,
    choose_form,
    gatherable,
    materialize,
    rescores_head,
)


def tied_forms(source: Source, weights: str, scales_only: bool | None) -> dict[str, Materialized]:
    """The LM head and embedding table of a tied model from their one matrix: one dense float tensor for
    both (``embed_tokens``; the LM head is tied to it after loading), one packed matrix for both where its
    form can be gathered, else each in its own form."""
    head = choose_form("lm_head", source, weights)
    table = choose_form("embedding", source, weights)
    if head == table == "float":
        return {"embed_tokens": materialize(source, "float")}
    lm_head = materialize(source, head, ranks=rescores_head(source, weights), scales_only=scales_only)
    if head == table and gatherable(lm_head):
        return {"lm_head": lm_head, "embed_tokens": lm_head}
    return {"lm_head": lm_head, "embed_tokens": materialize(source, table, scales_only=scales_only)}


def expert_forms(source: Loaded, weights: str, scales_only: bool | None) -> list[PackedWeight] | None:
    """Each expert of a stacked ``(experts, out, in)`` weight in its packed form, or None to keep it float (the
    form of a linear layer's matrix of the same kind, ``quant/policy.py``)."""
    experts: list[torch.Tensor | GGUFRows] = (list(source.experts) if isinstance(source, ExpertRows)
                                               else list(source.unbind(0)))  # type: ignore[union-attr]  # fmt: skip
    form = choose_form("linear", experts[0], weights)
    if form == "float":
        return None
    return [materialize(e, form, scales_only=scales_only) for e in experts]  # type: ignore[misc]


def swap_in(model: nn.Module, module_name: str, weight: Materialized, dtype: torch.dtype, rows: StepRows) -> None:
    """Replace the ``nn.Linear`` / ``nn.Embedding`` at ``module_name`` by its packed counterpart (a projection
    but the LM head reads the model's step ``rows``)."""
    parent_name, _, attr = module_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, attr)
    if isinstance(old, nn.Embedding):
        assert not isinstance(weight, torch.Tensor)
        setattr(parent, attr, QuantizedEmbedding(weight, dtype))
        return
    assert not isinstance(weight, (torch.Tensor, GGUFRows))
    bias = old.bias if old.bias is not None and old.bias.device.type != "meta" else None
    setattr(parent, attr, QuantizedLinear(weight, bias, rows=None if module_name == "lm_head" else rows))
