"""Load Llama-family weights from a HF safetensors directory or a GGUF file.

Both loaders return the architecture as a :class:`ModelConfig` and the tensors under HF transformers'
names (``model.layers.0.self_attn.q_proj.weight``...), in float32 on the CPU; the model fuses and casts
them. GGUF tensors are dequantised with the ``gguf`` package, and the Q/K projections are put back into
HF's rotary layout: llama.cpp's converter permutes their rows so that each head's two rotary halves are
interleaved (GPT-J style); we undo that so one RoPE implementation serves both sources.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sluice.engines.llm.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral")

_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def find_gguf(path: str | Path) -> Path | None:
    """``path`` itself if it is a ``.gguf`` file, the single ``.gguf`` in a directory without
    ``config.json``, else None."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return None


def load_weights(path: str | Path, gguf_reader: Any = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load a ``.gguf`` file or a directory holding ``config.json`` and ``*.safetensors``.

    ``gguf_reader``: an already opened ``gguf.GGUFReader`` of that file (parsing one takes seconds).
    """
    path = Path(path)
    gguf = find_gguf(path)
    if gguf is not None:
        return load_gguf(gguf, gguf_reader)
    if path.is_dir() and (path / "config.json").is_file():
        return load_safetensors_dir(path)
    raise ValueError(f"{path} is neither a .gguf file nor a directory with config.json and *.safetensors")


# ---------------------------------------------------------------- safetensors


def model_config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """Read a HF ``config.json`` dict; unsupported features (rope scaling, biases) are errors."""
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"rope scaling type {rope_type!r} is not supported")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("attention/MLP biases are not supported")
    num_heads = int(cfg["num_attention_heads"])
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def load_safetensors_dir(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = model_config_from_hf(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update({k: v.float() for k, v in load_file(str(f)).items()})
    return config, tensors


# ---------------------------------------------------------------- GGUF


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def model_config_from_gguf(reader: Any) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    if _field(reader, "llama.rope.scaling.type", "none") not in ("none", "linear") or _field(
        reader, "llama.rope.scaling.factor", 1.0
    ) not in (0.0, 1.0):
        raise ValueError("GGUF rope scaling is not supported")
    hidden = int(_field(reader, "llama.embedding_length"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    vocab = _field(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", num_heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // num_heads)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def unpermute_rotary_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a Q/K projection ``(num_heads * head_dim, in)``.

    llama.cpp stores, per head, rows ``[0, d/2, 1, d/2+1, ...]`` of HF's layout (interleaved rotary
    pairs); this returns rows in HF order ``[0, 1, ..., d/2-1, d/2, ...]`` (rotate-half pairs).
    """
    head_dim = w.shape[0] // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: Path, reader: Any = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = reader if reader is not None else GGUFReader(str(path))
    config = model_config_from_gguf(reader)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
        array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if not array.flags.writeable or not array.flags.c_contiguous:  # F32 tensors are views of the file
            array = np.array(array, dtype=np.float32, order="C", copy=True)
        if t.name in _GGUF_NAMES:
            name = _GGUF_NAMES[t.name]
        else:
            m = _GGUF_LAYER_RE.match(t.name)
            if m is None or m.group(2) not in _GGUF_LAYER_NAMES:
                raise ValueError(f"unexpected tensor {t.name!r} in {path.name}")
            layer, kind = m.group(1), m.group(2)
            if kind == "attn_q":
                array = unpermute_rotary_rows(array, config.num_heads)
            elif kind == "attn_k":
                array = unpermute_rotary_rows(array, config.num_kv_heads)
            name = f"model.layers.{layer}.{_GGUF_LAYER_NAMES[kind]}.weight"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(array))
    return config, tensors
