"""Every decoder layer of a decode-only step in one native call (``cpu/native/decode_layers.cpp``).

At one or a few sequences a CPU decode step of a small model costs as much in Python and ``nn.Module`` calls
as in its weights' matmuls: SmolLM2-135M's 30 layers make some 400 module calls and tensor operations a
step. For the common case -- a Llama-shaped layer (Llama, SmolLM2, Mistral, Qwen2/3 without
biases or q/k norms) whose projections are int4 on a CPU with the native int4 kernel -- the layer stack runs
in C++ instead: the same kernels in the same order and dtypes as the modules, so the hidden states are bit
for bit those of the module path (tested), only sooner.

It takes a step only when every row is a decode row of its own sequence (no prompt rows: those take the
dense path of ``model/layers/quantized.py``; no speculative verifies), with no LongRoPE rows; everything else
runs the modules. ``engine.kernels.native_decode_layers: false`` turns it off (benchmarks compare the two).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.model.attention import AttentionMetadata
from sluice.engines.llm.model.layers.decoder import LlamaDecoderLayer
from sluice.engines.llm.model.layers.mlp import GatedMLP
from sluice.engines.llm.model.layers.norm import RMSNorm
from sluice.engines.llm.model.layers.quantized import QuantizedLinear
from sluice.engines.llm.model.layers.self_attention import KVCache, SelfAttention
from sluice.engines.llm.quant.packed import Int4Weight


def _int4(module: nn.Module) -> Int4Weight | None:
    """The module's int4 weight, if it is a bias-free int4 projection."""
    if isinstance(module, QuantizedLinear) and isinstance(module.packed, Int4Weight) and module.bias is None:
        return module.packed
    return None


def _norm_weight(module: nn.Module) -> torch.Tensor | None:
    """A Llama RMSNorm's float32 weight (the native norm's case), else None."""
    if type(module) is RMSNorm and module.weight.dtype == torch.float32:
        return module.weight.detach()
    return None


class NativeDecodeLayers:
    """The layer stack's weights and KV caches as the native call takes them; build with :meth:`of`."""

    def __init__(self, tensors: list[list[torch.Tensor]], sizes: list[list[int]], kv_caches: list[KVCache],
                 eps: float, scale: float) -> None:  # fmt: skip
        self.tensors, self.sizes, self.kv_caches = tensors, sizes, kv_caches
        self.eps, self.scale = eps, scale

    @classmethod
    def of(cls, layers: Sequence[nn.Module], layer_rope: Sequence[int], kv_caches: list[KVCache]
           ) -> NativeDecodeLayers | None:  # fmt: skip
        """The native stack for a model's decoder ``layers`` (with the rotary table of each, ``layer_rope``)
        over ``kv_caches``, or None where some layer is not the case it computes exactly (another layer type
        or norm, biases, q/k norms, a layer without rotary, a soft-cap, another activation, experts, weights that are not int4, caches that are
        not bf16, several rotary tables) or the native int4 kernel is not built here."""
        if not native_cpu.int4_matmul_available() or len(set(layer_rope)) != 1:
            return None
        tensors: list[list[torch.Tensor]] = []
        sizes: list[list[int]] = []
        eps: float | None = None
        scale: float | None = None
        for layer, (k_cache, v_cache) in zip(layers, kv_caches, strict=True):
            if type(layer) is not LlamaDecoderLayer:
                return None
            attn, mlp = layer.self_attn, layer.mlp
            if not isinstance(mlp, GatedMLP):  # experts
                return None
            assert isinstance(attn, SelfAttention)
            norms = _norm_weight(layer.input_layernorm), _norm_weight(layer.post_attention_layernorm)
            weights = _int4(attn.qkv_proj), _int4(attn.o_proj), _int4(mlp.gate_up_proj), _int4(mlp.down_proj)
            if (any(n is None for n in norms) or any(w is None for w in weights) or attn.q_norm is not None
                    or not attn.rotates or attn.params.softcap is not None or mlp.act is not F.silu
                    or k_cache.dtype != torch.bfloat16 or not (k_cache.is_contiguous() and v_cache.is_contiguous())):  # fmt: skip
                return None
            in_norm, post_norm = layer.input_layernorm, layer.post_attention_layernorm
            assert isinstance(in_norm, RMSNorm) and isinstance(post_norm, RMSNorm)  # checked above
            layer_eps = (in_norm.eps, post_norm.eps)
            if eps is None:
                eps, scale = layer_eps[0], attn.params.scale
            if layer_eps != (eps, eps) or attn.params.scale != scale:
                return None
            qkv, o, gate_up, down = weights  # all set: checked above
            assert qkv is not None and o is not None and gate_up is not None and down is not None
            tensors.append([norms[0], qkv.packed, qkv.scale_zero, o.packed, o.scale_zero, norms[1],  # type: ignore[list-item]
                            gate_up.packed, gate_up.scale_zero, down.packed, down.scale_zero, k_cache, v_cache])  # fmt: skip
            sizes.append([attn.num_heads, attn.num_kv_heads, attn.head_dim, qkv.out_features, o.out_features,
                          gate_up.out_features, down.out_features, attn.params.sliding_window or 0])  # fmt: skip
        if eps is None or scale is None:
            return None
        return cls(tensors, sizes, kv_caches, eps, scale)

    def applies(self, h: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache], cos: torch.Tensor) -> bool:
        """Whether this step is one the native stack computes as the modules would: decode rows only (the
        caller routes no row to the dense path), no LongRoPE rows, the caches it was built over, bf16 rotary
        tables."""
        plan = meta.cpu_plan
        return (plan is not None and plan.decode_only and plan.decode_blocks is not None
                and meta.long_rope is None and kv_caches is self.kv_caches
                and h.dtype == torch.float32 and cos.dtype == torch.bfloat16)  # fmt: skip

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.cpu_plan
        assert plan is not None and plan.decode_blocks is not None and plan.decode_lens is not None
        n = h.shape[0]
        return native_cpu.decode_layers(h, self.tensors, self.sizes, cos, sin, meta.slot_mapping,
                                        plan.decode_blocks.view(n, -1), plan.decode_lens, self.eps, self.scale)  # fmt: skip
