"""SmolLM3: a Llama whose every fourth layer has no rotary embedding (NoPE).

From HF's ``SmolLM3ForCausalLM``: ``no_rope_layers`` lists per layer 1 (rotate q and k) or 0 (do not);
absent, a NoPE layer every ``no_rope_layer_interval`` layers (the 4th, 8th, ...). Tied embeddings by
default; optional ``attention_bias`` (q/k/v/o) and ``mlp_bias``; sliding windows on the layers
``layer_types`` marks when ``use_sliding_window`` is set. GGUF architecture ``smollm3``: llama.cpp fixes the
NoPE layers at every fourth (its converter writes no list), and permutes Q/K as for Llama.
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
    hf_sliding_windows,
)

NOPE_INTERVAL = 4  # HF's default no_rope_layer_interval, and llama.cpp's fixed step


def every_nth_without_rope(num_layers: int, interval: int) -> tuple[bool, ...]:
    return tuple((i + 1) % interval != 0 for i in range(num_layers))


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    cfg = {"tie_word_embeddings": True, **cfg}
    base = hf_base(cfg, "smollm3", max_position_embeddings=32768)
    num_layers = base["num_layers"]
    listed = cfg.get("no_rope_layers")
    if listed is not None:
        if len(listed) != num_layers:
            raise ValueError(f"config.json: no_rope_layers has {len(listed)} entries for {num_layers} layers")
        rotary = tuple(bool(flag) for flag in listed)
    else:
        rotary = every_nth_without_rope(num_layers, int(cfg.get("no_rope_layer_interval") or NOPE_INTERVAL))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    # HF: without layer_types, the sliding layers are the NoPE ones
    windows = hf_sliding_windows(cfg, num_layers, window, lambda layer: not rotary[layer])
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base, rope=hf_rope(cfg, default_theta=2e6), qkv_bias=bias, o_bias=bias,
                       mlp_bias=bool(cfg.get("mlp_bias", False)), rotary_layers=rotary if not all(rotary) else (),
                       sliding_windows=windows)  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "smollm3")
    rotary = every_nth_without_rope(base["num_layers"], NOPE_INTERVAL)
    names = meta.tensor_names
    return ModelConfig(**base, rope=gguf_rope(meta, base["head_dim"]), qkv_bias="blk.0.attn_q.bias" in names,
                       o_bias="blk.0.attn_output.bias" in names, rotary_layers=rotary if not all(rotary) else ())  # fmt: skip


FAMILY = ModelFamily(
    name="smollm3",
    hf_architectures=("SmolLM3ForCausalLM",),
    hf_model_types=("smollm3",),
    gguf_architectures=("smollm3",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    weights=WeightNames(gguf_permute_qk=True),
    models="SmolLM3",
    differs="no rotary on every fourth layer (`no_rope_layers`); rope theta 2M by default",
)
