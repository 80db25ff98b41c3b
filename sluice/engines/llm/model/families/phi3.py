"""Phi-3 / Phi-3.5 / Phi-4-mini (and Phi-4): a Llama with fused checkpoints, LongRoPE and partial rotary.

From HF's ``Phi3ForCausalLM``: ``qkv_proj`` and ``gate_up_proj`` are stored fused (loaded as they are);
``longrope`` scaling (``su`` in older configs): per-frequency short factors while a sequence fits in
``original_max_position_embeddings``, long factors for every position once it is longer -- HF recomputes the
KV cache when a sequence first grows past it, and so does Sluice (``ModelConfig.long_rope_switch_len``); the
cos/sin are scaled by ``sqrt(1 + ln(factor) / ln(original))``; ``partial_rotary_factor`` (Phi-4-mini 0.75)
rotates only the first dims of each head; an optional ``sliding_window`` on every layer. GGUF ``phi3``:
``attn_qkv`` and a fused ``ffn_up``, the factors as ``rope_factors_short`` / ``rope_factors_long`` tensors.
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
    hf_base,
    hf_rope,
    hf_sliding_windows,
)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    cfg = {"original_max_position_embeddings": 4096, **cfg}  # HF's Phi3Config default
    base = hf_base(cfg, "phi3", rms_norm_eps=1e-5, max_position_embeddings=4096)
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if params.get("rope_type", params.get("type")) in ("su", "yarn"):  # HF's Phi3Config maps both to longrope
        params["rope_type"] = "longrope"
    windows = hf_sliding_windows(cfg, base["num_layers"], cfg.get("sliding_window"), lambda _layer: True)
    return ModelConfig(**base, rope=hf_rope(cfg, params), sliding_windows=windows)


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "phi3")
    head_dim = base["head_dim"]
    rotary = int(meta.arch_get("rope.dimension_count", head_dim))
    theta = float(meta.arch_get("rope.freq_base", 10000.0))
    long, short = meta.tensor("rope_factors_long.weight"), meta.tensor("rope_factors_short.weight")
    if long is not None and short is not None:
        original = int(meta.require("rope.scaling.original_context_length"))
        rope = RopeConfig(
            theta=theta, scaling="longrope", partial_rotary_factor=rotary / head_dim,
            original_max_position_embeddings=original, factor=base["max_position_embeddings"] / original,
            short_factor=tuple(float(x) for x in short), long_factor=tuple(float(x) for x in long),
            attention_factor=meta.arch_get("rope.scaling.attn_factor"),
        )  # fmt: skip
    else:
        rope = RopeConfig(theta=theta, partial_rotary_factor=rotary / head_dim)
    window = meta.arch_get("attention.sliding_window") or None  # 0: none (Phi-4)
    windows = (int(window),) * base["num_layers"] if window else ()
    return ModelConfig(**base, rope=rope, sliding_windows=windows)


FAMILY = ModelFamily(
    name="phi3",
    hf_architectures=("Phi3ForCausalLM",),
    hf_model_types=("phi3",),
    gguf_architectures=("phi3",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    # already fused in the checkpoints; llama.cpp keeps gate+up fused in ffn_up
    weights=WeightNames(packed={}, gguf_layer_names={**GGUF_LLAMA_LAYER_NAMES, "ffn_up": "mlp.gate_up_proj"}),
    models="Phi-3 / 3.5, Phi-4-mini, Phi-4",
    differs="fused qkv and gate_up checkpoints, LongRoPE, partial rotary, optional window",
)
