"""Qwen2 / Qwen2.5: a Llama with biases on the q/k/v projections (none on the output projection).

Also from HF's ``Qwen2ForCausalLM``: a large rope theta (1e6), tied embeddings on the small sizes, and
optional sliding windows (``use_sliding_window``: the layers from ``max_window_layers`` on, or as
``layer_types`` lists them). GGUF architecture ``qwen2``: no Q/K permutation (llama.cpp rotates NeoX-style).
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
    hf_sliding_windows,
)


def hf_qwen_windows(cfg: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Qwen2/Qwen3's sliding layers: ``layer_types`` if listed, else those from ``max_window_layers`` on."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    first = int(cfg.get("max_window_layers", num_layers))
    return hf_sliding_windows(cfg, num_layers, window, lambda layer: layer >= first)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    base = hf_base(cfg, "qwen2", max_position_embeddings=32768)
    return ModelConfig(**base, rope=hf_rope(cfg), qkv_bias=True,
                       sliding_windows=hf_qwen_windows(cfg, base["num_layers"]))  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "qwen2")
    return ModelConfig(**base, rope=gguf_rope(meta, base["head_dim"]), qkv_bias=True)


FAMILY = ModelFamily(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    hf_model_types=("qwen2",),
    gguf_architectures=("qwen2",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    models="Qwen2 / Qwen2.5",
    differs="q/k/v biases; optional windows (`use_sliding_window`)",
)
