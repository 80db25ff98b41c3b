"""Gemma 2: sandwich norms, (1 + w) norms, scaled embeddings, GeGLU, soft-capping, alternating windows.

From HF's ``Gemma2ForCausalLM``: every RMSNorm is Gemma's ``(1 + w) * x`` in fp32 (HF checkpoints store
``w``; llama.cpp's converter already adds the 1); embeddings are multiplied by ``sqrt(hidden_size)`` (rounded
to the weights' dtype, as HF does); norms before *and after* attention and the MLP; a ``gelu_pytorch_tanh``
gated MLP; attention scale ``query_pre_attn_scalar ** -0.5``; attention scores soft-capped at
``attn_logit_softcapping`` and final logits at ``final_logit_softcapping`` (``c * tanh(x / c)``); a sliding
window on every other layer (the even ones). GGUF ``gemma2`` carries the soft-caps and the window but not
``query_pre_attn_scalar``: as llama.cpp, it is ``hidden / heads`` for the 27B (46 layers), else head_dim.
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.families.common import (
    GGUF_LLAMA_LAYER_NAMES,
    GGUFMetadata,
    ModelFamily,
    WeightNames,
    gguf_base,
    gguf_rope,
    hf_base,
    hf_rope,
    hf_sliding_windows,
)

# llama.cpp's names for Gemma's four norms (its ffn_norm is the pre-feedforward norm here)
GGUF_GEMMA_LAYER_NAMES = {
    **GGUF_LLAMA_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_gemma_base(cfg: dict[str, Any], architecture: str, max_position_embeddings: int) -> dict[str, Any]:
    """What Gemma 2 and 3 read alike, with HF's config-class defaults for the keys a config omits."""
    cfg = {"head_dim": 256, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh", **cfg}
    base = hf_base(cfg, architecture, max_position_embeddings=max_position_embeddings)
    bias = bool(cfg.get("attention_bias", False))
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma (an embedding model) is not a causal LM; use an encoder engine")
    return dict(
        **base, gemma_norms=True, sandwich_norms=True, qkv_bias=bias, o_bias=bias,
        embed_scale=float(base["hidden_size"]) ** 0.5,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
    )  # fmt: skip


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    base = hf_gemma_base(cfg, "gemma2", max_position_embeddings=8192)
    windows = hf_sliding_windows(cfg, base["num_layers"], cfg.get("sliding_window", 4096), lambda i: i % 2 == 0)
    return ModelConfig(
        **base, rope=hf_rope(cfg), sliding_windows=windows,
        attn_logit_softcap=cfg.get("attn_logit_softcapping", 50.0),
        final_logit_softcap=cfg.get("final_logit_softcapping", 30.0),
    )  # fmt: skip


def gguf_gemma_base(meta: GGUFMetadata, architecture: str, num_layers_27b: int) -> dict[str, Any]:
    base = gguf_base(meta, architecture)
    wide = base["num_layers"] == num_layers_27b  # the 27B scales queries by hidden / heads (llama.cpp)
    return dict(
        **base, hidden_act="gelu_tanh", gemma_norms=True, sandwich_norms=True,
        embed_scale=float(base["hidden_size"]) ** 0.5,
        query_pre_attn_scalar=float(base["hidden_size"] // base["num_heads"] if wide else base["head_dim"]),
        final_logit_softcap=meta.arch_get("final_logit_softcapping"),
        attn_logit_softcap=meta.arch_get("attn_logit_softcapping"),
    )  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_gemma_base(meta, "gemma2", num_layers_27b=46)
    window = meta.arch_get("attention.sliding_window")
    windows = tuple(int(window) if i % 2 == 0 else None for i in range(base["num_layers"])) if window else ()
    return ModelConfig(**base, rope=gguf_rope(meta, base["head_dim"]), sliding_windows=windows)


GEMMA_WEIGHTS = WeightNames(gguf_layer_names=GGUF_GEMMA_LAYER_NAMES, hf_norm_plus_one=True)

FAMILY = ModelFamily(
    name="gemma2",
    hf_architectures=("Gemma2ForCausalLM",),
    hf_model_types=("gemma2",),
    gguf_architectures=("gemma2",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="gemma",
    weights=GEMMA_WEIGHTS,
    models="Gemma 2",
    differs=(
        "(1 + w) norms, pre and post norms, scaled embeddings, GeGLU, `query_pre_attn_scalar`, attention "
        "and final-logit soft-caps, windows on alternate layers"
    ),
)
