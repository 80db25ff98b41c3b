"""Self-attention over the paged KV cache, shared by every family.

One fused Q/K/V matmul (with biases when the family has them), optional q/k RMSNorm before the rotary (per
head: Qwen3, Gemma 3; across heads: OLMo 2), rotary on the first ``rotary_dim`` dims (none on SmolLM3's NoPE
layers), then :func:`store_and_attend` with this layer's :class:`AttentionParams` (scale, sliding window,
logit soft-cap, gpt-oss's per-head sinks), then the output projection.
Without q/k norms the query and key heads are rotated in one call (the same arithmetic per element: the
rotation does not mix heads), which halves the rotary's operations per layer.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.kernel_plan import KernelPlan
from sluice.engines.llm.model.attention import AttentionMetadata, AttentionParams, store_and_attend
from sluice.engines.llm.model.layers.norm import make_norm
from sluice.engines.llm.model.layers.rotary import apply_rotary

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k, v), each (num_blocks, block_size, num_kv_heads, head_dim)


class Sinks(nn.Module):
    """gpt-oss: each head's sink logit, float32 whatever the model's dtype (the softmax takes it so)."""

    FP32_PARAMS = ("weight",)

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads))


class SelfAttention(nn.Module):
    native = True  # the native rotary kernel where it takes the rows (set from the engine's KernelPlan)

    def use_kernels(self, plan: KernelPlan) -> None:
        self.native = plan.native_cpu

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.qk_norm_across_heads = cfg.qk_norm_across_heads
        q_width, k_width = (self.q_size, self.kv_size) if cfg.qk_norm_across_heads else (self.head_dim, self.head_dim)
        self.q_norm = make_norm(q_width, cfg) if cfg.qk_norm else None
        self.k_norm = make_norm(k_width, cfg) if cfg.qk_norm else None
        self.rotates = cfg.rotates(layer)
        self.sinks = Sinks(cfg.num_heads) if cfg.attention_sinks else None
        self.params = AttentionParams(cfg.attn_scale, cfg.sliding_window(layer), cfg.attn_logit_softcap)

    def forward(
        self,
        x: torch.Tensor,  # (num_tokens, hidden)
        cos: torch.Tensor,  # (num_tokens, 1, rotary_dim)
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, hidden)
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # (n, q_size + 2 * kv_size)
        if self.q_norm is not None and self.k_norm is not None:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            if self.qk_norm_across_heads:  # OLMo 2: one norm over every head's features
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.reshape(n, self.num_heads, self.head_dim), k.reshape(n, self.num_kv_heads, self.head_dim)
            if not self.qk_norm_across_heads:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.rotates:
                q, k = apply_rotary(q, cos, sin, self.native), apply_rotary(k, cos, sin, self.native)
        elif not self.rotates:
            q = qkv[:, : self.q_size].view(n, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(n, self.num_kv_heads, self.head_dim)
        else:
            qk = qkv[:, : self.q_size + self.kv_size].view(n, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = apply_rotary(qk, cos, sin, self.native).split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(n, self.num_kv_heads, self.head_dim)
        params = self.params if self.sinks is None else replace(self.params, sinks=self.sinks.weight)
        o = store_and_attend(q, k, v, kv_cache[0], kv_cache[1], meta, params)  # in q's dtype
        if isinstance(self.o_proj, nn.Linear) and o.dtype != self.o_proj.weight.dtype:
            o = o.to(self.o_proj.weight.dtype)  # bf16 attention before a float projection (mixed checkpoints)
        return self.o_proj(o.reshape(n, self.q_size))
