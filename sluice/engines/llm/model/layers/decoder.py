"""The decoder layers (blocks) of the model families, by the name a family gives in ``decoder_layer``.

Four block shapes cover every supported family: ``llama`` (pre-norm; also Mistral, Qwen2/3, Phi-3, SmolLM3),
``granite`` (pre-norm with scaled residual branches), ``olmo2`` (post-norms only) and ``gemma`` (sandwich
norms, Gemma 2 and 3). The families themselves (``model/families/``) are plain data and config
parsing, readable without torch; the model (``model/causal_lm.py``) builds ``DECODER_LAYERS[family.decoder_layer]``.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.attention import AttentionMetadata
from sluice.engines.llm.model.layers.mlp import GatedMLP
from sluice.engines.llm.model.layers.moe import SparseMoE
from sluice.engines.llm.model.layers.norm import make_norm
from sluice.engines.llm.model.layers.self_attention import KVCache, SelfAttention


def make_mlp(cfg: ModelConfig, layer: int) -> nn.Module:
    """``layer``'s MLP: the sparse mixture of experts where the config has experts there, else the gated MLP."""
    return SparseMoE(cfg) if cfg.has_experts(layer) else GatedMLP(cfg)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))`` (also Mistral, Qwen2/3, Phi-3)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = make_norm(cfg.hidden_size, cfg)
        self.self_attn = SelfAttention(cfg, layer)
        self.post_attention_layernorm = make_norm(cfg.hidden_size, cfg)
        self.mlp = make_mlp(cfg, layer)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class GraniteDecoderLayer(LlamaDecoderLayer):
    """Llama's block with each branch scaled before its residual add: ``h += m * attn(norm(h))`` (Granite)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        assert cfg.residual_multiplier is not None, "the granite block needs residual_multiplier"
        self.residual_multiplier = cfg.residual_multiplier

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        m = self.residual_multiplier
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta) * m
        return h + self.mlp(self.post_attention_layernorm(h)) * m


class Olmo2DecoderLayer(nn.Module):
    """Post-norm block: ``h += norm(attn(h)); h += norm(mlp(h))``, no norm before either branch (OLMo 2)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg, layer)
        self.post_attention_layernorm = make_norm(cfg.hidden_size, cfg)
        self.mlp = make_mlp(cfg, layer)
        self.post_feedforward_layernorm = make_norm(cfg.hidden_size, cfg)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = h + self.post_attention_layernorm(self.self_attn(h, cos, sin, kv_cache, meta))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class GemmaDecoderLayer(nn.Module):
    """``h += post_norm(attn(pre_norm(h))); h += post_ff_norm(mlp(pre_ff_norm(h)))`` (Gemma 2 and 3)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        size = cfg.hidden_size
        self.input_layernorm = make_norm(size, cfg)
        self.self_attn = SelfAttention(cfg, layer)
        self.post_attention_layernorm = make_norm(size, cfg)
        self.pre_feedforward_layernorm = make_norm(size, cfg)
        self.mlp = make_mlp(cfg, layer)
        self.post_feedforward_layernorm = make_norm(size, cfg)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


# a family's decoder_layer -> the block it is built of, as decoder_layer(config, layer_index)
DECODER_LAYERS: dict[str, type[nn.Module]] = {
    "llama": LlamaDecoderLayer,
    "granite": GraniteDecoderLayer,
    "olmo2": Olmo2DecoderLayer,
    "gemma": GemmaDecoderLayer,
}
