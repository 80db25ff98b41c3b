"""Mixtral (8x7B, 8x22B): Mistral's attention with a sparse mixture of experts on every layer.

From HF's ``MixtralForCausalLM``: each token goes to ``num_experts_per_tok`` of ``num_local_experts``
experts of width ``intermediate_size`` (``model/layers/moe.py``), their softmax weights always renormalised;
expert matrices ``w1`` (gate), ``w3`` (up), ``w2`` (down) under ``block_sparse_moe``; an optional sliding
window on every layer. llama.cpp's converter writes Mixtral as a ``llama`` GGUF with experts, which the
llama family reads (``model/families/llama.py``).
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.model.families.common import (
    ModelFamily,
    WeightNames,
    hf_base,
    hf_rope,
    hf_sliding_windows,
)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    cfg = {"num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6, **cfg}  # MixtralConfig's defaults
    base = hf_base(cfg, "mixtral", max_position_embeddings=4096 * 32, rms_norm_eps=1e-5)
    windows = hf_sliding_windows(cfg, base["num_layers"], cfg.get("sliding_window"), lambda _layer: True)
    return ModelConfig(
        **base, rope=hf_rope(cfg), sliding_windows=windows, num_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]), moe_intermediate_size=base["intermediate_size"],
        norm_topk_prob=True,
    )  # fmt: skip


FAMILY = ModelFamily(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    hf_model_types=("mixtral",),
    gguf_architectures=(),
    config_from_hf=config_from_hf,
    config_from_gguf=None,
    decoder_layer="llama",
    weights=WeightNames(hf_renames=(("block_sparse_moe.", "mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."),
                                    (".w2.", ".down_proj."))),  # fmt: skip
    models="Mixtral 8x7B, 8x22B",
    differs="a sparse mixture of experts on every layer (top-2 of 8, renormalised); an optional window",
)
