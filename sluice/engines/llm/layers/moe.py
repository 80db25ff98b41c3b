"""The sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks each token's experts, and the
experts' gated MLPs run as two grouped matmuls over the tokens sorted by expert.

Routing follows HF transformers' ``Qwen3MoeTopKRouter`` / ``MixtralTopKRouter``: router logits
``x @ W_r.T``, a softmax over all experts in fp32, the top ``k`` of it, renormalised to sum to one when the
config says so (Mixtral always; Qwen3-MoE by ``norm_topk_prob``), cast back to the activations' dtype.

The experts' weights are two stacked tensors, ``gate_up_proj.weight`` ``(experts, 2 * width, hidden)`` and
``down_proj.weight`` ``(experts, hidden, width)`` (HF's layout; a checkpoint's per-expert matrices are stacked
at load, ``weights.py``), transposed once loaded so that each is one ``(experts, in, out)`` operand of
``torch.nn.functional.grouped_mm``: the ``tokens * k`` rows, sorted by expert, are multiplied in one call per
projection (a loop in C++ on the CPU), never a Python loop over experts. Where the attention takes the
Triton kernels (CUDA), the experts do too (``kernels/triton_moe.py``: the rows sorted and padded per
expert into blocks, one launch per projection).
An expert's output is weighted by its routing weight and the ``k`` outputs of a token are added in the
order of their expert ids, as HF's ``index_add_`` over the experts in turn adds them.

Guarantees: greedy tokens equal HF's in fp32 (``tests/engines/llm/test_families.py``). Not yet: batch
invariance (an expert's matmul sees however many rows the batch routed to it), packed int4 / int8 experts
(they stay in the model's dtype whatever ``weights`` says; the router too, always).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.kernels import kernel_path
from sluice.engines.llm.layers.mlp import ACTIVATIONS


class Router(nn.Module):
    """The router's ``(experts, hidden)`` matrix: a parameter, not an ``nn.Linear``, so that the weight
    policy never packs it (a quantised router would send tokens to other experts)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))


class Stacked(nn.Module):
    """One projection of every expert: ``weight`` ``(experts, out, in)`` as loaded (HF's layout, the
    checkpoint's per-expert matrices stacked), ``(experts, in, out)`` once :meth:`finish_loading` ran."""

    def __init__(self, num_experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.transposed = False

    def finish_loading(self) -> None:
        """Transpose to ``(experts, in, out)``, contiguous: ``grouped_mm``'s right operand."""
        if not self.transposed:
            self.weight = nn.Parameter(self.weight.detach().transpose(1, 2).contiguous(), requires_grad=False)
            self.transposed = True


class GroupedExperts(nn.Module):
    """Every expert's fused gate/up projection and its down projection."""

    def __init__(self, num_experts: int, hidden_size: int, width: int) -> None:
        super().__init__()
        self.gate_up_proj = Stacked(num_experts, 2 * width, hidden_size)
        self.down_proj = Stacked(num_experts, hidden_size, width)
        self.width = width


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.normalize = cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Router(cfg.hidden_size, cfg.num_experts)
        self.experts = GroupedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each ``(tokens, k)``, the ids ascending along each row."""
        logits = F.linear(x, self.gate.weight.to(x.dtype))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        ids, order = ids.sort(dim=-1)
        return weights.gather(-1, order).to(logits.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (tokens, hidden) -> same
        n, k = x.shape[0], self.top_k
        weights, ids = self.route(x)
        flat = ids.reshape(-1)  # (tokens * k,) token-major
        gate_up_w = self.experts.gate_up_proj.weight.to(x.dtype)
        down_w = self.experts.down_proj.weight.to(x.dtype)
        if kernel_path(x) == "triton":  # one kernel per projection, rows sorted by expert inside
            from sluice.engines.llm.kernels.triton_moe import grouped_matmul

            gate, up = grouped_matmul(x, gate_up_w, flat, k).split(self.experts.width, dim=-1)
            out = grouped_matmul(self.act(gate) * up, down_w, flat, 1)  # (tokens * k, hidden) token-major
        else:
            by_expert = torch.argsort(flat, stable=True)
            offsets = torch.bincount(flat, minlength=self.num_experts).cumsum(0).to(torch.int32)
            rows = x.index_select(0, by_expert // k)  # (tokens * k, hidden), grouped by expert
            gate, up = F.grouped_mm(rows, gate_up_w, offs=offsets).split(self.experts.width, dim=-1)
            grouped = F.grouped_mm(self.act(gate) * up, down_w, offs=offsets)
            out = torch.empty_like(grouped).index_copy_(0, by_expert, grouped)  # back to token-major
        per_slot = out.view(n, k, -1) * weights.unsqueeze(-1)
        total = per_slot[:, 0]
        for slot in range(1, k):  # in expert-id order, as HF adds them
            total = total + per_slot[:, slot]
        return total
