"""Randomly initialised HF checkpoints of every supported family, for tests and benchmarks.

:func:`save_random_model` builds a model with HF transformers from a preset (or any config), optionally
rescales its weights, and writes ``config.json`` + ``model.safetensors`` with ``save_pretrained`` -- exactly
what a user's checkpoint directory holds, so Sluice loads it through its ordinary HF path. Two kinds of
presets:

* real shapes, for speed checks: ``llama-3.2-1b`` and ``qwen3-0.6b`` (published configs, random weights;
  build them on the GPU machine with ``device="cuda", dtype=torch.bfloat16``);
* ``tiny-<family>`` (a few layers, hidden 64), for exact parity tests against HF: sliding windows, rope
  scaling contexts and soft-caps small enough to matter on prompts of a few dozen tokens. Pass
  ``weight_std`` (e.g. 0.15) to make next-token distributions peaked, so that greedy argmax ties cannot hide
  a bug, and ``vocab_size`` to match a tokenizer saved beside the model.

Needs ``transformers`` (the ``torch`` or ``dev`` extra). Command line::

    python -m sluice.engines.llm.random_models qwen3-0.6b OUT_DIR --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

_TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip

PRESETS: dict[str, dict[str, Any]] = {
    # published shapes (config.json of meta-llama/Llama-3.2-1B and Qwen/Qwen3-0.6B)
    "llama-3.2-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    ),
    # tiny parity shapes: every family-specific feature switched on and small enough to matter
    "tiny-llama": dict(
        model_type="llama", num_hidden_layers=3, tie_word_embeddings=True, **_TINY,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=32),
    ),
    "tiny-mistral": dict(model_type="mistral", num_hidden_layers=3, sliding_window=12, **_TINY),
    "tiny-qwen2": dict(model_type="qwen2", num_hidden_layers=3, tie_word_embeddings=True,
                       rope_parameters=dict(rope_type="default", rope_theta=1000000.0), **_TINY),
    "tiny-qwen3": dict(model_type="qwen3", num_hidden_layers=3, **{**_TINY, "head_dim": 32}),
    "tiny-gemma2": dict(
        model_type="gemma2", num_hidden_layers=3, sliding_window=10, query_pre_attn_scalar=16,
        attn_logit_softcapping=5.0, final_logit_softcapping=8.0, **_TINY,
    ),
    "tiny-gemma3": dict(
        model_type="gemma3_text", num_hidden_layers=6, sliding_window=10, query_pre_attn_scalar=16, **_TINY,
        rope_parameters=dict(full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                             sliding_attention=dict(rope_type="default", rope_theta=10000.0)),
    ),
    "tiny-phi3": dict(
        model_type="phi3", num_hidden_layers=3, sliding_window=24, original_max_position_embeddings=32,
        **{**_TINY, "max_position_embeddings": 128, "head_dim": None},
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                             short_factor=[1.0, 1.05, 1.1, 1.3, 1.6, 2.0], long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0]),
    ),
    "tiny-granite": dict(
        model_type="granite", num_hidden_layers=3, embedding_multiplier=6.0, attention_multiplier=0.1,
        residual_multiplier=0.3, logits_scaling=4.0, **{**_TINY, "head_dim": None},
    ),
    # layers 4 and 8 without rotary (NoPE)
    "tiny-smollm3": dict(model_type="smollm3", num_hidden_layers=8, tie_word_embeddings=True,
                         **{**_TINY, "head_dim": None}),
    # 6 experts of width 32, 2 per token: short prompts use most of them
    "tiny-qwen3_moe": dict(model_type="qwen3_moe", num_hidden_layers=3, num_experts=6, num_experts_per_tok=2,
                           moe_intermediate_size=32, norm_topk_prob=True, **{**_TINY, "head_dim": 32}),
    "tiny-mixtral": dict(model_type="mixtral", num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
                         **_TINY),
    # 2 of 6 experts per token, sinks, an 8-token window on alternate layers, yarn over a 32-token context,
    # the SwiGLU clamp low enough to bite
    "tiny-gpt_oss": dict(model_type="gpt_oss", num_hidden_layers=4, num_local_experts=6, num_experts_per_tok=2,
                         sliding_window=8, swiglu_limit=1.5, **_TINY,
                         rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0,
                                              beta_slow=1.0, original_max_position_embeddings=32, truncate=False)),
    "tiny-olmo2": dict(model_type="olmo2", num_hidden_layers=3, rms_norm_eps=1e-6, **{**_TINY, "head_dim": None}),
}  # fmt: skip


def hf_config(preset: str | Mapping[str, Any], **overrides: Any) -> Any:
    """A ``transformers`` config for ``preset`` (a name in :data:`PRESETS` or a dict with ``model_type``)."""
    from transformers import AutoConfig

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    kwargs = {**preset, **overrides}
    kwargs = {k: v for k, v in kwargs.items() if not (k == "head_dim" and v is None)}
    return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)


def save_random_model(
    path: str | Path,
    preset: str | Mapping[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    weight_std: float | None = None,
    **overrides: Any,
) -> Path:
    """Write a random HF checkpoint of ``preset`` (plus ``overrides`` of its config) to ``path``; return it.

    ``weight_std``: redraw every matrix from N(0, std), every norm's scale from U(1, 3) and every bias from
    N(0, std / 2) (None keeps transformers' initialisation, std 0.02). Deterministic per ``seed``.
    """
    from transformers import AutoModelForCausalLM

    config = hf_config(preset, **overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    if weight_std is not None:
        _rescale(model, weight_std)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


@torch.no_grad()
def _rescale(model: torch.nn.Module, std: float) -> None:
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, std)
        elif "norm" in name:
            # Scales drawn from U(1, 3): larger than the identity, so that with Gemma's post-norms the blocks
            # outweigh the (scaled, tied) embedding in the residual and a tied head does not just echo the input.
            # Gemma's norms multiply by (1 + w) and start at w = 0; the others by w, starting at 1.
            identity = p.mean()
            p.copy_(torch.rand_like(p) * 2 + identity)
        else:
            p.normal_(0.0, std / 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a randomly initialised HF checkpoint of a preset shape.")
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weight-std", type=float, default=None)
    args = parser.parse_args(argv)
    path = save_random_model(args.out_dir, args.preset, dtype=getattr(torch, args.dtype), device=args.device,
                             seed=args.seed, weight_std=args.weight_std)  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
