"""The decoder layers (blocks) of the model families, by the name a family gives in ``decoder_layer``.

Two block shapes cover every supported family: ``llama`` (pre-norm; also Mistral, Qwen2/3, Phi-3) and
``gemma`` (sandwich norms, Gemma 2 and 3). The families themselves (``models/``) are plain data and config
parsing, readable without torch; the model (``model.py``) builds ``DECODER_LAYERS[family.decoder_layer]``.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.engines.llm.attention import AttentionMetadata
from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.layers.mlp import GatedMLP
from sluice.engines.llm.layers.norm import make_norm
from sluice.engines.llm.layers.self_attention import KVCache, SelfAttention


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))`` (also Mistral, Qwen2/3, Phi-3)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = make_norm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma_norms)
        self.self_attn = SelfAttention(cfg, layer)
        self.post_attention_layernorm = make_norm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma_norms)
        self.mlp = GatedMLP(cfg)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class GemmaDecoderLayer(nn.Module):
    """``h += post_norm(attn(pre_norm(h))); h += post_ff_norm(mlp(pre_ff_norm(h)))`` (Gemma 2 and 3)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        size, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = make_norm(size, eps, gemma=True)
        self.self_attn = SelfAttention(cfg, layer)
        self.post_attention_layernorm = make_norm(size, eps, gemma=True)
        self.pre_feedforward_layernorm = make_norm(size, eps, gemma=True)
        self.mlp = GatedMLP(cfg)
        self.post_feedforward_layernorm = make_norm(size, eps, gemma=True)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


# a family's decoder_layer -> the block it is built of, as decoder_layer(config, layer_index)
DECODER_LAYERS: dict[str, type[nn.Module]] = {"llama": LlamaDecoderLayer, "gemma": GemmaDecoderLayer}
