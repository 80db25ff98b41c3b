"""The gated MLP of every supported family: ``down(act(gate(x)) * up(x))`` with gate and up fused."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernel_plan import KernelPlan

# by ModelConfig's names: silu (HF's silu / swish), gelu_tanh (HF's gelu_pytorch_tanh, Gemma), gelu (exact erf),
# relu
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class GatedMLP(nn.Module):
    native = True  # the native silu_mul where it takes the rows (set from the engine's KernelPlan)

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.native_cpu

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        # one matmul for gate and up: fewer, larger matmuls (checkpoints' gate/up rows are concatenated)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (num_tokens, hidden) -> same
        gate_up = self.gate_up_proj(x)
        if (self.act is F.silu and gate_up.dtype == torch.bfloat16 and gate_up.dim() == 2 and self.native
                and native_cpu.takes(gate_up)):
            return self.down_proj(native_cpu.silu_mul(gate_up))  # packed projections' bf16: one call, not three
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act(gate) * up)
