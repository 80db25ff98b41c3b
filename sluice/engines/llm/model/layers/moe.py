"""The sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral, gpt-oss): a router picks each token's experts, and
the experts' gated MLPs run as two grouped matmuls over the tokens sorted by expert.

Routing follows HF transformers' ``Qwen3MoeTopKRouter`` / ``MixtralTopKRouter``: router logits
``x @ W_r.T``, a softmax over all experts in fp32, the top ``k`` of it, renormalised to sum to one when the
config says so (Mixtral always; Qwen3-MoE by ``norm_topk_prob``), cast back to the activations' dtype; or
``GptOssTopKRouter``'s: logits with a bias, their top ``k``, the softmax of those. gpt-oss's experts also
have biases and a clamped SwiGLU (:meth:`SparseMoE.gated`).

The experts' weights are two stacked tensors, ``gate_up_proj.weight`` ``(experts, 2 * width, hidden)`` and
``down_proj.weight`` ``(experts, hidden, width)`` (HF's layout; a checkpoint's per-expert matrices are stacked
at load, ``weights.py``), transposed once loaded so that each is one ``(experts, in, out)`` operand of
``torch.nn.functional.grouped_mm``: the ``tokens * k`` rows, sorted by expert, are multiplied in one call per
projection (a loop in C++ on the CPU), never a Python loop over experts. Where the attention takes the
Triton kernels (CUDA), the experts do too (``kernels/triton_moe.py``: the rows sorted and padded per
expert into blocks, one launch per projection).
An expert's output is weighted by its routing weight and the ``k`` outputs of a token are added in the
order of their expert ids, as HF's ``index_add_`` over the experts in turn adds them.

On the CPU the experts may be packed (:class:`PackedStacked`: int4, int8 or bf16 per ``weights``, a quantised
GGUF's kept as int4 / int8 under ``auto``); the router never is.

Guarantees: greedy tokens equal HF's in fp32 (``tests/engines/llm/test_families.py``). Not yet: batch
invariance (an expert's matmul sees however many rows the batch routed to it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernel_plan import KernelPlan
from sluice.engines.llm.kernels import graph_ops, kernel_path
from sluice.engines.llm.model.layers.mlp import ACTIVATIONS
from sluice.engines.llm.quant.packed import COMPUTE_DTYPE, Int4Weight, PackedWeight


class Router(nn.Module):
    """The router's ``(experts, hidden)`` matrix (and gpt-oss's bias): parameters, not an ``nn.Linear``, so
    that the weight policy never packs them (a quantised router would send tokens to other experts)."""

    def __init__(self, hidden_size: int, num_experts: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.bias = nn.Parameter(torch.empty(num_experts)) if bias else None


class Stacked(nn.Module):
    """One projection of every expert: ``weight`` ``(experts, out, in)`` as loaded (HF's layout, the
    checkpoint's per-expert matrices stacked), ``(experts, in, out)`` once :meth:`finish_loading` ran."""

    def __init__(self, num_experts: int, out_features: int, in_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_experts, out_features)) if bias else None
        self.transposed = False

    def finish_loading(self) -> None:
        """Transpose to ``(experts, in, out)``, contiguous: ``grouped_mm``'s right operand."""
        if not self.transposed:
            self.weight = nn.Parameter(self.weight.detach().transpose(1, 2).contiguous(), requires_grad=False)
            self.transposed = True


    def grouped(self, rows: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """``rows`` sorted by expert (expert ``e``'s end at ``ends[e]``, int32) times each one's matrix."""
        return F.grouped_mm(rows, self.weight.to(rows.dtype), offs=ends)


class PackedStacked(nn.Module):
    """One projection of every expert in a packed CPU form (``weights``: int4 / int8 / bf16, or a quantised
    GGUF's experts under ``auto``: ``quant/policy.py``), standing in for :class:`Stacked` once loaded.

    Int4 experts where Sluice's int4 kernel runs go through one native call that loops over the experts
    (``cpu/native/int4_grouped.cpp``); other forms (int8, bf16, int4 on CPUs without AVX512-BF16) call
    each expert that some row chose in turn, from Python."""

    def __init__(self, experts: list[PackedWeight], bias: torch.Tensor | None) -> None:
        super().__init__()
        self.experts = experts
        self.bias = bias  # (experts, out) in the model's dtype, or None
        self.out_features = experts[0].out_features
        int4 = [w for w in experts if isinstance(w, Int4Weight)]
        # the native call's arguments, gathered once here rather than on every step
        self.int4_tensors = ([w.packed for w in int4], [w.scale_zero for w in int4]) if len(int4) == len(experts) else None
        self.native: bool | None = None  # Sluice's int4 kernel (the engine's KernelPlan; None: what is built)

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.int4_matmul
        for expert in self.experts:  # the loop below calls each expert's own matmul
            if isinstance(expert, Int4Weight):
                expert.native = plan.int4_matmul

    def grouped(self, rows: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """As :meth:`Stacked.grouped`, in ``rows``' dtype (computed in bf16)."""
        if self.native is None:
            self.native = native_cpu.int4_matmul_available()
        if self.int4_tensors is not None and self.native:
            out = native_cpu.int4_grouped_matmul(rows.to(COMPUTE_DTYPE).contiguous(), ends.to(torch.int64),
                                                 *self.int4_tensors)
            return out[:, : self.out_features].to(rows.dtype)
        out = torch.empty(rows.shape[0], self.out_features, dtype=rows.dtype)
        start = 0
        for expert, end in zip(self.experts, ends.tolist(), strict=True):  # only the experts rows chose
            if end > start:
                out[start:end] = expert.matmul(rows[start:end])
            start = end
        return out


def pack_experts(model: nn.Module, packed: dict[str, list[PackedWeight]]) -> None:
    """Swap the :class:`Stacked` modules named in ``packed`` for their packed experts (biases kept)."""
    for name, experts in packed.items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, attr)
        bias = old.bias if old.bias is not None and old.bias.device.type != "meta" else None
        setattr(parent, attr, PackedStacked(experts, bias))


class GroupedExperts(nn.Module):
    """Every expert's fused gate/up projection and its down projection."""

    def __init__(self, num_experts: int, hidden_size: int, width: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = Stacked(num_experts, 2 * width, hidden_size, bias)
        self.down_proj = Stacked(num_experts, hidden_size, width, bias)
        self.width = width


class SparseMoE(nn.Module):
    kernel_path: str | None = None  # the engine's KernelPlan.attention; None: the device's default

    def use_kernels(self, plan: KernelPlan) -> None:
        self.kernel_path = plan.attention

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.normalize = cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.softmax_after_topk = cfg.router_softmax_after_topk
        self.gate = Router(cfg.hidden_size, cfg.num_experts, cfg.moe_bias)
        self.experts = GroupedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.moe_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.swiglu_limit, self.swiglu_alpha = cfg.swiglu_limit, cfg.swiglu_alpha

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each ``(tokens, k)``, the ids ascending along each row."""
        bias = None if self.gate.bias is None else self.gate.bias.to(x.dtype)
        logits = F.linear(x, self.gate.weight.to(x.dtype), bias)
        if self.softmax_after_topk:  # gpt-oss: the top-k logits, then their softmax
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1, dtype=top.dtype)
        else:
            weights, ids = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        ids, order = ids.sort(dim=-1)
        return weights.gather(-1, order).to(logits.dtype), ids

    def gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.swiglu_limit is None:
            return self.act(gate) * up
        limit = self.swiglu_limit  # gpt-oss's clamped SwiGLU
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.swiglu_alpha))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (tokens, hidden) -> same
        n, k = x.shape[0], self.top_k
        weights, ids = self.route(x)
        flat = ids.reshape(-1)  # (tokens * k,) token-major
        gate_up_proj, down_proj, width = self.experts.gate_up_proj, self.experts.down_proj, self.experts.width
        if (self.kernel_path or kernel_path(x)) == "triton" and isinstance(gate_up_proj, Stacked):  # one kernel per projection
            grouped_matmul = _grouped_matmul()

            gate_up = _biased(grouped_matmul(x, gate_up_proj.weight.to(x.dtype), flat, k), gate_up_proj, flat)
            gate, up = gate_up.split(width, dim=-1)
            out = _biased(grouped_matmul(self.gated(gate, up), down_proj.weight.to(x.dtype), flat, 1), down_proj,
                          flat)  # (tokens * k, hidden) token-major  # fmt: skip
        else:
            by_expert = torch.argsort(flat, stable=True)
            expert_of = flat.index_select(0, by_expert)
            ends = _counts(flat, self.num_experts).cumsum(0).to(torch.int32)
            rows = x.index_select(0, by_expert // k)  # (tokens * k, hidden), grouped by expert
            gate_up = _biased(gate_up_proj.grouped(rows, ends), gate_up_proj, expert_of)
            gate, up = gate_up.split(width, dim=-1)
            grouped = _biased(down_proj.grouped(self.gated(gate, up), ends), down_proj, expert_of)
            out = torch.empty_like(grouped).index_copy_(0, by_expert, grouped)  # back to token-major
        per_slot = out.view(n, k, -1) * weights.unsqueeze(-1)
        total = per_slot[:, 0]
        for slot in range(1, k):  # in expert-id order, as HF adds them
            total = total + per_slot[:, slot]
        return total


def _grouped_matmul() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """The Triton grouped matmul; in a compiled decode step, as one opaque call sized without a host read."""
    if graph_ops.compiling():
        return graph_ops.moe_grouped_matmul  # type: ignore[return-value]
    from sluice.engines.llm.kernels.triton_moe import grouped_matmul

    return grouped_matmul


def _counts(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Rows per expert: ``bincount``'s, whose output size a compiled step cannot know (its length is the
    largest id + 1), so counted into a fixed ``(experts,)`` there."""
    if not graph_ops.compiling():
        return torch.bincount(ids, minlength=num_experts)
    return torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))


def _biased(rows: torch.Tensor, proj: Stacked | PackedStacked, experts: torch.Tensor) -> torch.Tensor:
    """``rows`` plus each row's expert's bias (gpt-oss), or ``rows`` as they are."""
    return rows if proj.bias is None else rows + proj.bias.to(rows.dtype).index_select(0, experts)
