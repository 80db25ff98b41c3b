"""Modules over packed weights (:mod:`sluice.engines.llm.quant`): a linear layer and an embedding table.

They stand in for ``nn.Linear`` / ``nn.Embedding`` once the model is built (``CausalLM.from_weights``
swaps them in). A linear layer's output is bf16 (plus a bias in the model's dtype, if any): the next packed
matmul takes it as it is, and adding it to the float32 residual stream promotes it there. Embedding rows
come in the model's dtype.

Prompt rows (:class:`StepRows`): where only torch's int4 kernel runs (Sluice's own, ``Int4Weight.matmul``,
needs a CPU with AVX512-BF16, and is about as fast as the GEMM below at 512 rows, far faster at fewer), the
runner names the rows of a step that are prompt positions; an int4 projection multiplies those through its
weight dequantised to bf16 (``int4_dense``: faster than torch's kernel at a prompt's hundreds of rows)
and the others -- decode rows, speculative drafts, generated tokens recomputed after a preemption -- through
the int4 kernel. The split is by what a row is, never by how many rows share the step, and both paths are
row-invariant, so a projection gives a token the same numbers whatever it is batched with: with the per-row
attention of ``attention.py`` a request's answer is the same with and without speculation, however its prompt is
chunked or cached (``tests/engines/llm/test_batch_invariance.py``). A block of generated tokens in the prefix
cache was computed by the other path, so it never stands in for prompt positions (``kv_cache.py``:
``mark_prompt_positions``). The LM head (built without ``rows``) always takes the int4 kernel: it sees the
sampled rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernel_plan import KernelPlan
from sluice.engines.llm.quant import int4_dense
from sluice.engines.llm.quant.gguf_rows import GGUFRows
from sluice.engines.llm.quant.packed import COMPUTE_DTYPE, Int4Weight, PackedWeight


@dataclass(frozen=True)
class RowSplit:
    """Rows of a step's flat batch: ``dense`` (prompt positions) and ``rest``, int64 indices, both sorted."""

    dense: torch.Tensor
    rest: torch.Tensor

    @classmethod
    def of(cls, is_dense: list[bool]) -> RowSplit | None:
        """None when no row is dense (nothing to route)."""
        if not any(is_dense):
            return None
        flags = torch.tensor(is_dense)
        return cls(flags.nonzero().flatten(), (~flags).nonzero().flatten())


class StepRows:
    """The prompt rows of the step being computed: set by the model around each forward
    (``CausalLM.forward``'s ``dense_rows``), read by every :class:`QuantizedLinear` built over it."""

    __slots__ = ("split",)

    def __init__(self) -> None:
        self.split: RowSplit | None = None


class QuantizedLinear(nn.Module):
    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None, rows: StepRows | None = None) -> None:
        """``rows``: the model's step rows, for a projection that routes prompt rows (None: never routes)."""
        super().__init__()
        self.packed = weight
        self.bias = bias  # (out_features,) in the model's dtype, or None
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.rows = rows if isinstance(weight, Int4Weight) else None
        self.native = True  # the native unpacking of dense rows (the engine's KernelPlan.native_cpu)

    @property
    def routes_rows(self) -> bool:
        return self.rows is not None

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.native_cpu
        if isinstance(self.packed, Int4Weight):
            self.packed.native = plan.int4_matmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (num_tokens, in) -> (num_tokens, out) bf16
        split = self.rows.split if self.rows is not None else None
        if split is None or not (self.native and int4_dense.available(x)):
            y = self.packed.matmul(x)
        elif not split.rest.numel():
            y = int4_dense.dense_matmul(self.packed, x)  # type: ignore[arg-type]
        else:
            y = torch.empty(x.shape[0], self.out_features, dtype=COMPUTE_DTYPE)
            y.index_copy_(0, split.dense, int4_dense.dense_matmul(self.packed, x.index_select(0, split.dense)))  # type: ignore[arg-type]
            y.index_copy_(0, split.rest, self.packed.matmul(x.index_select(0, split.rest)))
        return y if self.bias is None else y + self.bias


class QuantizedEmbedding(nn.Module):
    """Rows of a packed matrix (a tied LM head's) or of a GGUF table kept as its raw blocks."""

    def __init__(self, table: PackedWeight | GGUFRows, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = table
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (num_tokens,) -> (num_tokens, hidden)
        rows = self.table.gather(ids) if isinstance(self.table, GGUFRows) else self.table.rows(ids)
        return rows.to(self.dtype)


class RescoredHead(nn.Module):
    """An LM head whose packed matmul is rescored: the ``top_k`` highest logits of each row are recomputed in
    float32 from the checkpoint's own values (a GGUF matrix's raw rows).

    The packed pass ranks the vocabulary; only its best few candidates can be the argmax, and for those the
    logits are the exact head's (up to float32 summation order) -- so greedy picks and the top of the
    distribution are those of the dequantised model, at the cost of ``top_k`` dequantised rows per row.
    ``TOP_K`` leaves a wide margin over the rank the exact argmax reaches in the packed logits of an int4 head
    over greedy positions of varied prompts, on the small and the 1B-shaped models it was measured on.
    """

    TOP_K = 32

    native = True  # the native top-k (the engine's KernelPlan.native_cpu)

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.native_cpu

    def __init__(self, fast: nn.Module, exact: GGUFRows, top_k: int = TOP_K) -> None:
        super().__init__()
        self.fast = fast
        self.exact = exact
        self.top_k = min(top_k, exact.shape[0])

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (num_rows, hidden) -> (num_rows, vocab) float32
        packed = self.fast(h)
        if self.native and native_cpu.takes(packed) and packed.dtype in (torch.float32, torch.bfloat16):
            top = native_cpu.top_k_rows(packed, self.top_k)  # (num_rows, top_k); far cheaper than torch.topk
        else:
            top = packed.float().topk(self.top_k, dim=-1).indices
        logits = packed.float()
        rows = self.exact.gather(top)  # (num_rows, top_k, hidden) float32
        # a product and a sum over each row's own values: bmm sums a batch of one in another order
        rescored = (rows * h.float().unsqueeze(1)).sum(-1)  # (num_rows, top_k)
        return logits.scatter_(1, top, rescored)


PACKED_MODULES = (QuantizedLinear, QuantizedEmbedding, RescoredHead)


def packed_nbytes(model: nn.Module) -> int:
    """Bytes of the packed weights and kept GGUF rows under ``model`` (a shared matrix counted once)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for held in (getattr(module, "packed", None), getattr(module, "table", None), getattr(module, "exact", None)):
            if isinstance(held, GGUFRows):
                seen[id(held)] = sum(int(p.data.nbytes) for p in held.parts if hasattr(p, "data"))
            elif held is not None:
                seen[id(held)] = int(held.nbytes)
    return sum(seen.values())


def describe_forms(model: nn.Module) -> str:
    """One line on the forms the model's weights took: ``"projections Int4Weight x121, lm_head rescored from
    the file's rows, embed_tokens the file's Q8_0 rows; 86 MiB packed"`` (``""`` when every weight is dense;
    a packed LM head counts among the projections)."""
    forms: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            forms[type(module.packed).__name__] = forms.get(type(module.packed).__name__, 0) + 1
    if not forms:
        return ""
    parts = ["projections " + ", ".join(f"{name} x{n}" for name, n in sorted(forms.items()))]
    head, table = getattr(model, "lm_head", None), getattr(model, "embed_tokens", None)
    if isinstance(head, RescoredHead):
        parts.append("lm_head rescored from the file's rows")
    if isinstance(table, QuantizedEmbedding) and isinstance(table.table, GGUFRows):
        parts.append(f"embed_tokens the file's {table.table.type_name} rows")
    return ", ".join(parts) + f"; {packed_nbytes(model) / 2**20:.0f} MiB packed"
