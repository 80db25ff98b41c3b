"""Granite (IBM Granite 3.x dense): a Llama with four multipliers.

From HF's ``GraniteForCausalLM``: embeddings times ``embedding_multiplier``; the attention scale is
``attention_multiplier`` itself (not ``head_dim ** -0.5``); each block's attention and MLP outputs are times
``residual_multiplier`` before their residual add (the ``granite`` block of ``model/layers/decoder.py``); logits are
divided by ``logits_scaling``. Optional ``attention_bias`` (q/k/v/o) and ``mlp_bias``. GGUF architecture
``granite``: llama.cpp's converter writes the multipliers as ``attention.scale``, ``embedding_scale``,
``residual_scale`` and ``logit_scale`` and permutes Q/K as for Llama.
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.families.common import (
    GGUFMetadata,
    ModelFamily,
    WeightNames,
    gguf_base,
    gguf_rope,
    hf_base,
    hf_rope,
)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **hf_base(cfg, "granite"), rope=hf_rope(cfg), qkv_bias=bias, o_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
        attention_multiplier=float(cfg.get("attention_multiplier", 1.0)),
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
        logits_divisor=float(cfg.get("logits_scaling", 1.0)),
    )  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "granite")
    bias = "blk.0.attn_q.bias" in meta.tensor_names
    return ModelConfig(
        **base, rope=gguf_rope(meta, base["head_dim"]), qkv_bias=bias,
        o_bias="blk.0.attn_output.bias" in meta.tensor_names, mlp_bias="blk.0.ffn_up.bias" in meta.tensor_names,
        embedding_multiplier=float(meta.arch_get("embedding_scale", 1.0)),
        attention_multiplier=float(meta.arch_get("attention.scale", 1.0)),
        residual_multiplier=float(meta.arch_get("residual_scale", 1.0)),
        logits_divisor=float(meta.arch_get("logit_scale", 1.0)),
    )  # fmt: skip


FAMILY = ModelFamily(
    name="granite",
    hf_architectures=("GraniteForCausalLM",),
    hf_model_types=("granite",),
    gguf_architectures=("granite",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="granite",
    weights=WeightNames(gguf_permute_qk=True),
    models="IBM Granite 3.x (dense)",
    differs="embedding, attention and residual multipliers; logits divided by `logits_scaling`",
)
