"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with a sparse mixture of experts.

From HF's ``Qwen3MoeForCausalLM``: the attention is Qwen3's (per-head q/k norms, ``head_dim`` when given);
every layer whose index + 1 is a multiple of ``decoder_sparse_step`` and which is not in
``mlp_only_layers`` routes each token to ``num_experts_per_tok`` of ``num_experts`` experts of width
``moe_intermediate_size`` (``model/layers/moe.py``), renormalising their weights when ``norm_topk_prob``; the
other layers have the dense MLP of ``intermediate_size``. No shared expert. A sliding window, when
``use_sliding_window``, on every layer. GGUF architecture ``qwen3moe`` (stacked ``ffn_*_exps`` tensors;
llama.cpp always renormalises, as the published models do).
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


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    # the Hub's configs say num_experts; transformers 5 saves num_local_experts
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 128
    cfg = {"num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
           "norm_topk_prob": False, **cfg}  # HF's Qwen3MoeConfig defaults  # fmt: skip
    base = hf_base(cfg, "qwen3_moe", max_position_embeddings=32768)
    num_layers, step = base["num_layers"], int(cfg["decoder_sparse_step"])
    dense = set(cfg.get("mlp_only_layers") or ())
    sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **base, rope=hf_rope(cfg), qk_norm=True, qkv_bias=bias, o_bias=bias,
        sliding_windows=(int(window),) * num_layers if window else (),
        num_experts=int(experts), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]), norm_topk_prob=bool(cfg["norm_topk_prob"]),
        sparse_layers=sparse if not all(sparse) else (),
    )  # fmt: skip


def gguf_experts(meta: GGUFMetadata, num_layers: int) -> dict[str, Any]:
    """The ``ModelConfig`` fields of llama.cpp's expert keys (every layer sparse), or {} for a dense model."""
    count = int(meta.arch_get("expert_count", 0) or 0)
    if not count:
        return {}
    width = meta.arch_get("expert_feed_forward_length")
    if width is None:  # Mixtral: the experts have the MLP's width
        width = meta.require("feed_forward_length")
    gating = int(meta.arch_get("expert_gating_func", 1) or 1)
    if gating != 1:  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid, 3 softmax of the weights
        raise ValueError(f"GGUF {meta.arch}: expert_gating_func {gating} is not supported (supported: 1, softmax)")
    if meta.arch_get("expert_shared_count") or "blk.0.ffn_gate_shexp.weight" in meta.tensor_names:
        raise ValueError(f"GGUF {meta.arch}: shared experts are not supported")
    missing = [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in meta.tensor_names]
    if missing:
        raise ValueError(f"GGUF {meta.arch}: layers {missing} have no experts; mixed dense and expert layers "
                         "are not supported from GGUF")  # fmt: skip
    return dict(num_experts=count, num_experts_per_tok=int(meta.require("expert_used_count")),
                moe_intermediate_size=int(width),
                norm_topk_prob=bool(meta.arch_get("expert_weights_norm", True)))  # fmt: skip


def config_from_gguf(meta: GGUFMetadata) -> ModelConfig:
    base = gguf_base(meta, "qwen3_moe")
    names = meta.tensor_names
    return ModelConfig(**base, rope=gguf_rope(meta, base["head_dim"]), qk_norm=True,
                       qkv_bias="blk.0.attn_q.bias" in names, o_bias="blk.0.attn_output.bias" in names,
                       **gguf_experts(meta, base["num_layers"]))  # fmt: skip


FAMILY = ModelFamily(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hf_model_types=("qwen3_moe",),
    gguf_architectures=("qwen3moe",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    decoder_layer="llama",
    models="Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B)",
    differs=(
        "Qwen3's attention; a sparse mixture of experts (top-k of a softmax router, renormalised by "
        "`norm_topk_prob`) on the layers `decoder_sparse_step` and `mlp_only_layers` leave sparse"
    ),
)
