"""Mistral (7B v0.1-v0.3, Nemo-shaped checkpoints): a Llama whose every layer may have a sliding window.

HF's ``MistralForCausalLM`` differs from Llama only in ``sliding_window`` (v0.1: 4096; later versions
``null``), applied to every layer: a query sees its own position and the ``window - 1`` before it. llama.cpp
converts Mistral to the ``llama`` GGUF architecture without the window, so a Mistral GGUF loads as a Llama
(full attention, as llama.cpp runs it).
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.families.common import ModelFamily, hf_base, hf_rope, hf_sliding_windows


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    base = hf_base(cfg, "mistral", max_position_embeddings=4096 * 32)
    windows = hf_sliding_windows(cfg, base["num_layers"], cfg.get("sliding_window", 4096), lambda _layer: True)
    return ModelConfig(**base, rope=hf_rope(cfg), sliding_windows=windows)


FAMILY = ModelFamily(
    name="mistral",
    hf_architectures=("MistralForCausalLM",),
    hf_model_types=("mistral",),
    gguf_architectures=(),
    config_from_hf=config_from_hf,
    config_from_gguf=None,
    decoder_layer="llama",
    models="Mistral 7B and its fine-tunes",
    differs="a sliding window on every layer",
)
