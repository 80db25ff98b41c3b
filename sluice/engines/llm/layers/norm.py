"""RMSNorm in its two flavours: Llama's (``w * x``, cast before the multiply) and Gemma's (``(1 + w) * x``
in fp32, cast after), each matching its HF transformers module operation by operation."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Llama / Qwen / Mistral / Phi-3: normalise in fp32, cast back, then scale by ``weight``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def normalized(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same, fp32
        h = x.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same
        return self.weight * self.normalized(x).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma 2 / 3: normalise and scale by ``1 + w`` in fp32, then cast.

    ``weight`` holds ``1 + w`` already (computed in fp32 at load time: HF checkpoints store ``w``, llama.cpp's
    GGUF files store ``1 + w``), and stays fp32 whatever the model's dtype (``FP32_PARAMS``), so that the
    product is HF's ``x_fp32 * (1.0 + w.float())`` exactly.
    """

    FP32_PARAMS = ("weight",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden) -> same
        return (self.normalized(x) * self.weight).to(x.dtype)


def make_norm(size: int, eps: float, gemma: bool) -> nn.Module:
    return GemmaRMSNorm(size, eps) if gemma else RMSNorm(size, eps)
