"""RMSNorm in its three flavours: Llama's (``w * x``, cast before the multiply), OLMo 2's (``w * x`` in fp32,
cast after) and Gemma's (``(1 + w) * x`` in fp32, cast after), each matching its HF transformers module
operation by operation.

Where the arithmetic is the same, torch's fused ``F.rms_norm`` computes it in one call instead of six
(``x * rsqrt(mean(x^2) + eps) * w`` in fp32: bit for bit HF's for float32 inputs, and for Gemma's
multiply-then-cast at any dtype); a Llama norm of bf16 / fp16 activations keeps HF's cast-then-multiply.
On the CPU a float32 Llama norm runs in the native kernel (:mod:`..kernels.native_cpu`): the same formula
in one call, equal to torch's to float32 rounding (its sum of squares is added up in another order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernel_plan import KernelPlan


class RMSNorm(nn.Module):
    """Llama / Qwen / Mistral / Phi-3: normalise in fp32, cast back, then scale by ``weight``."""

    native = True  # the native kernel where it takes the rows (set from the engine's KernelPlan)

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.native_cpu

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def normalized(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same, fp32
        h = x.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            if self.native and native_cpu.takes(x):
                return native_cpu.rms_norm(x, self.weight, self.eps)  # one call, not six
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * self.normalized(x).to(x.dtype)


class CastAfterRMSNorm(RMSNorm):
    """OLMo 2: normalise and scale by ``w`` in fp32, then cast.

    ``weight`` stays fp32 whatever the model's dtype (``FP32_PARAMS``): a bf16 checkpoint's values converted
    exactly, so the product is HF's ``w * x_fp32`` (which promotes ``w`` to fp32) exactly.
    """

    FP32_PARAMS = ("weight",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same
        return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(x.dtype)


class GemmaRMSNorm(CastAfterRMSNorm):
    """Gemma 2 / 3: normalise and scale by ``1 + w`` in fp32, then cast.

    ``weight`` holds ``1 + w`` already (computed in fp32 at load time: HF checkpoints store ``w``, llama.cpp's
    GGUF files store ``1 + w``), kept in fp32 as OLMo 2's, so that the product is HF's
    ``x_fp32 * (1.0 + w.float())`` exactly.
    """


def make_norm(size: int, cfg: ModelConfig) -> nn.Module:
    """The norm of ``cfg``'s family over ``size`` features."""
    if cfg.gemma_norms:
        return GemmaRMSNorm(size, cfg.rms_norm_eps)
    if cfg.norms_cast_after:
        return CastAfterRMSNorm(size, cfg.rms_norm_eps)
    return RMSNorm(size, cfg.rms_norm_eps)
