"""Qwen3 (dense): a Llama with a per-head RMSNorm on q and k before the rotary, and an explicit head_dim.

From HF's ``Qwen3ForCausalLM``: ``q_norm`` / ``k_norm`` (Llama-style RMSNorm over ``head_dim``), ``head_dim``
independent of ``hidden_size / num_heads`` (Qwen3-0.6B: 1024 hidden, 16 heads of 128), optional
``attention_bias`` (q/k/v/o), sliding windows as Qwen2. GGUF architecture ``qwen3`` (``attn_q_norm``,
``attn_k_norm``).
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.families.common import (
    GGUFMetadata,
    ModelFamily,
    gguf_base,
    gguf_rope,
    hf_base,
    hf_rope,
)
from sluice.engines.llm.model.families.qwen2 import hf_qwen_windows


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    base = hf_base(cfg, "qwen3", max_position_embeddings=32768, head_dim=128)
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base, rope=hf_rope(cfg), qk_norm=True, qkv_bias=bias, o_bias=bias,
                       sliding_windows=hf_qwen_windows(cfg, base["num_layers"]))  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "qwen3")
    bias = "blk.0.attn_q.bias" in meta.tensor_names
    return ModelConfig(**base, rope=gguf_rope(meta, base["head_dim"]), qk_norm=True, qkv_bias=bias,
                       o_bias="blk.0.attn_output.bias" in meta.tensor_names)  # fmt: skip


FAMILY = ModelFamily(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    hf_model_types=("qwen3",),
    gguf_architectures=("qwen3",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    models="Qwen3 (dense)",
    differs="per-head q/k RMSNorm; `head_dim` independent of the hidden size",
)
