"""Llama (2, 3, 3.1, 3.2, 3.3; SmolLM2 and other Llama-shaped checkpoints): the reference decoder layer.

Beyond the plain block, HF's ``LlamaForCausalLM`` has ``llama3`` rope scaling (factor, low/high frequency
factors, original context; also linear, dynamic and yarn), tied embeddings (Llama 3.2 1B/3B), optional
``attention_bias`` (q/k/v/o) and ``mlp_bias``. In GGUF (architecture ``llama``) llama.cpp's converter
permutes the Q/K rows into interleaved rotary pairs, which the loader undoes, and stores llama3 scaling as a
``rope_freqs`` tensor of per-frequency divisors. Mixtral is a ``llama`` GGUF with experts (``expert_count``).
"""

from __future__ import annotations

from dataclasses import replace
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
from sluice.engines.llm.model.families.qwen3_moe import gguf_experts


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**hf_base(cfg, "llama"), rope=hf_rope(cfg), qkv_bias=bias, o_bias=bias,
                       mlp_bias=bool(cfg.get("mlp_bias", False)))  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "llama")
    rope = gguf_rope(meta, base["head_dim"])
    freq_factors = meta.tensor("rope_freqs.weight")
    if freq_factors is not None:
        rope = replace(rope, freq_factors=tuple(float(f) for f in freq_factors))
    return ModelConfig(**base, rope=rope, **gguf_experts(meta, base["num_layers"]))  # experts: a Mixtral


FAMILY = ModelFamily(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    hf_model_types=("llama",),
    gguf_architectures=("llama",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    weights=WeightNames(gguf_permute_qk=True),
    models="Llama 2 / 3.x, SmolLM2",
    differs=(
        "(the reference) rope scaling `llama3` / `linear` / `dynamic` / `yarn`; tied embeddings (3.2 "
        "1B/3B); optional attention and MLP biases"
    ),
)
