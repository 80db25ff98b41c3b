"""OLMo 2: post-norm blocks and q/k norms across all heads.

From HF's ``Olmo2ForCausalLM``: no norm before attention or the MLP; instead their outputs are normed before
the residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``: the ``olmo2`` block of
``model/layers/decoder.py``); ``q_norm`` / ``k_norm`` normalise q_proj's and k_proj's whole outputs (every head
together) before the rotary; every norm scales in fp32 and casts after. Optional ``attention_bias``. GGUF
architecture ``olmo2`` (``post_attention_norm``, ``post_ffw_norm``; Q/K not permuted).
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig, RopeConfig
from sluice.engines.llm.model.families.common import (
    GGUF_LLAMA_LAYER_NAMES,
    GGUFMetadata,
    ModelFamily,
    WeightNames,
    gguf_base,
    gguf_rope,
    hf_base,
    hf_rope,
)


def _olmo2(base: dict[str, Any], rope: RopeConfig, bias: bool) -> ModelConfig:
    return ModelConfig(**base, rope=rope, qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_across_heads=True,
                       norms_cast_after=True)  # fmt: skip


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return _olmo2(hf_base(cfg, "olmo2", rms_norm_eps=1e-5), hf_rope(cfg), bool(cfg.get("attention_bias", False)))


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "olmo2")
    return _olmo2(base, gguf_rope(meta, base["head_dim"]), "blk.0.attn_q.bias" in meta.tensor_names)


FAMILY = ModelFamily(
    name="olmo2",
    hf_architectures=("Olmo2ForCausalLM",),
    hf_model_types=("olmo2",),
    gguf_architectures=("olmo2",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="olmo2",
    weights=WeightNames(gguf_layer_names={
        **GGUF_LLAMA_LAYER_NAMES,
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }),
    models="OLMo 2",
    differs="norms after attention and the MLP instead of before; q/k norms across all heads",
)  # fmt: skip
