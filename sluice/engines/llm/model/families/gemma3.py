"""Gemma 3 (text): Gemma 2's block without soft-capping, plus q/k norms, 5 local : 1 global layers and a
separate rope for the local (sliding-window) layers.

From HF's ``Gemma3ForCausalLM`` (``gemma3_text``; the text half of ``Gemma3ForConditionalGeneration``, whose
vision tower and projector are not loaded): Gemma's ``(1 + w)`` q_norm / k_norm on each head before the
rotary; a sliding window on every layer but each ``sliding_window_pattern``-th (6), or as ``layer_types``
lists them; rope theta 1e6 with optional linear scaling on global layers, 1e4 unscaled on local ones
(``rope_local_base_freq``, or ``rope_parameters`` per layer type). Soft-caps only when a config sets them.
GGUF ``gemma3``: ``rope.freq_base`` / ``rope.freq_base_swa``, the pattern from
``attention.sliding_window_pattern`` when present (else 6, as llama.cpp).
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig, RopeConfig
from sluice.engines.llm.model.families.common import (
    GGUFMetadata,
    ModelFamily,
    WeightNames,
    gguf_rope,
    hf_rope,
    hf_sliding_windows,
)
from sluice.engines.llm.model.families.gemma2 import GEMMA_WEIGHTS, gguf_gemma_base, hf_gemma_base

DEFAULT_PATTERN = 6  # every 6th layer is global


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal ``gemma3`` config keeps the decoder's settings under ``text_config``."""
    return {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg


def hf_ropes(cfg: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(global rope, local rope) from per-layer-type ``rope_parameters`` or the older flat keys."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full, local = params["full_attention"] or {}, params.get("sliding_attention") or {}
        return hf_rope(cfg, full, default_theta=1e6), hf_rope(cfg, {"rope_theta": 1e4, **local})
    full = {"rope_theta": cfg.get("rope_theta", 1e6), **(cfg.get("rope_scaling") or {})}
    local = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 1e4)}
    return hf_rope(cfg, full), hf_rope(cfg, local)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    cfg = text_config(cfg)
    base = hf_gemma_base(cfg, "gemma3", max_position_embeddings=131072)
    pattern = int(cfg.get("sliding_window_pattern") or DEFAULT_PATTERN)
    windows = hf_sliding_windows(cfg, base["num_layers"], cfg.get("sliding_window", 4096),
                                 lambda i: (i + 1) % pattern != 0)  # fmt: skip
    rope, local_rope = hf_ropes(cfg)
    return ModelConfig(
        **base, rope=rope, local_rope=local_rope, qk_norm=True, sliding_windows=windows,
        attn_logit_softcap=cfg.get("attn_logit_softcapping"), final_logit_softcap=cfg.get("final_logit_softcapping"),
    )  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_gemma_base(meta, "gemma3", num_layers_27b=62)
    num_layers = base["num_layers"]
    window = meta.arch_get("attention.sliding_window")
    pattern = meta.arch_get("attention.sliding_window_pattern", DEFAULT_PATTERN)
    if isinstance(pattern, list):  # one flag per layer: True = sliding
        flags = [bool(p) for p in pattern]
    else:
        flags = [(i + 1) % int(pattern) != 0 for i in range(num_layers)]
    windows = tuple(int(window) if flag else None for flag in flags) if window else ()
    rope = gguf_rope(meta, base["head_dim"], default_theta=1e6)
    local_rope = RopeConfig(theta=float(meta.arch_get("rope.freq_base_swa", 1e4)),
                            partial_rotary_factor=rope.partial_rotary_factor)  # fmt: skip
    return ModelConfig(**base, rope=rope, local_rope=local_rope, qk_norm=True, sliding_windows=windows)


FAMILY = ModelFamily(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    hf_model_types=("gemma3_text", "gemma3"),
    gguf_architectures=("gemma3",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="gemma",
    weights=WeightNames(
        gguf_layer_names=GEMMA_WEIGHTS.gguf_layer_names,
        hf_norm_plus_one=True,
        # transformers 5 nests the decoder under model.language_model, older checkpoints under language_model
        hf_prefixes=("model.language_model.", "language_model.model.", "model."),
        hf_lm_head=("lm_head.weight", "language_model.lm_head.weight"),
        skipped=("rotary_emb.inv_freq", "vision_tower", "multi_modal_projector"),
    ),
    models="Gemma 3 (text; also the text half of `Gemma3ForConditionalGeneration`)",
    differs=(
        "as Gemma 2 without soft-caps, plus q/k norms, 5 local to 1 global layers, local and global rope "
        "thetas"
    ),
)
