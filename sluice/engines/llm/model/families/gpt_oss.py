"""gpt-oss (gpt-oss-20b, gpt-oss-120b): attention sinks, alternating windows and clamped-SwiGLU experts.

From HF's ``GptOssForCausalLM``: q/k/v/o with biases; each head has a learned sink logit that joins its
softmax with no value (``self_attn.sinks``: attention may go nowhere); layers alternate a sliding window
(``layer_types``, 128 positions) and full attention; yarn rope. Every layer is a sparse mixture of
experts whose router has a bias and takes the softmax of its top-k logits; the experts have biases and a
clamped SwiGLU, ``(up + 1) * g * sigmoid(1.702 g)`` with ``g <= 7`` and ``-7 <= up <= 7`` (``model/layers/moe.py``).
Norms scale in fp32 and cast after. The published checkpoints hold the experts as MXFP4
(``quantization_config.quant_method: mxfp4``), dequantised at load (``quant/mxfp4.py``). GGUF architecture
``gpt-oss`` (experts MXFP4 or float, dequantised at load; llama.cpp fixes the SwiGLU clamp at 7).
"""

from __future__ import annotations

from dataclasses import replace
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
from sluice.engines.llm.model.families.qwen3_moe import gguf_experts

# llama.cpp's limit and alpha of the clamped SwiGLU, fixed in its gpt-oss graph (GGUF files carry neither)
GGUF_SWIGLU_LIMIT, GGUF_SWIGLU_ALPHA = 7.0, 1.702


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    cfg = {"num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True,
           "head_dim": 64, "swiglu_limit": 7.0, "swiglu_alpha": 1.702, **cfg}  # GptOssConfig's defaults  # fmt: skip
    if "rope_parameters" not in cfg and "rope_scaling" not in cfg:  # GptOssConfig's default rope
        cfg["rope_parameters"] = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                      beta_slow=1.0, original_max_position_embeddings=4096, truncate=False)  # fmt: skip
    base = hf_base(cfg, "gpt_oss", readable_quant=("mxfp4",), max_position_embeddings=131072, rms_norm_eps=1e-5)
    num_layers = base["num_layers"]
    window = cfg.get("sliding_window")
    windows = hf_sliding_windows(cfg, num_layers, window, lambda layer: layer % 2 == 0)
    bias = bool(cfg["attention_bias"])
    limit = cfg.get("swiglu_limit")
    return ModelConfig(
        **base, rope=hf_rope(cfg), qkv_bias=bias, o_bias=bias, sliding_windows=windows, norms_cast_after=True,
        attention_sinks=True, num_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]), moe_intermediate_size=base["intermediate_size"],
        router_softmax_after_topk=True, moe_bias=True, swiglu_limit=None if limit is None else float(limit),
        swiglu_alpha=float(cfg["swiglu_alpha"]),
    )  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "gpt_oss")
    num_layers = base["num_layers"]
    # HF's yarn for gpt-oss does not truncate its correction range (GGUF has no key for it)
    rope = replace(gguf_rope(meta, base["head_dim"]), truncate=False)
    window = meta.arch_get("attention.sliding_window")
    windows = tuple(int(window) if i % 2 == 0 else None for i in range(num_layers)) if window else ()
    return ModelConfig(
        **base, rope=rope, qkv_bias=True, o_bias=True, sliding_windows=windows, norms_cast_after=True,
        attention_sinks=True, **gguf_experts(meta, num_layers), router_softmax_after_topk=True, moe_bias=True,
        swiglu_limit=GGUF_SWIGLU_LIMIT, swiglu_alpha=GGUF_SWIGLU_ALPHA,
    )  # fmt: skip


FAMILY = ModelFamily(
    name="gpt_oss",
    hf_architectures=("GptOssForCausalLM",),
    hf_model_types=("gpt_oss",),
    gguf_architectures=("gpt-oss",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    # llama.cpp's converter splits gate/up (gate first, as the model keeps them) and names the pre-MLP norm
    # post_attention_norm
    weights=WeightNames(hf_experts="gpt_oss", gguf_layer_names={
        **GGUF_LLAMA_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks",
    }),  # fmt: skip
    models="gpt-oss-20b, gpt-oss-120b",
    differs=(
        "attention sinks, sliding windows on alternate layers, yarn rope; experts on every layer with a "
        "biased router (softmax of the top-k), biases and a clamped SwiGLU; MXFP4 experts dequantised at load"
    ),
)
