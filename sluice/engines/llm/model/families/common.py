"""What a model family declares, and the parsing helpers the family modules share.

A :class:`ModelFamily` gives the engine three things (vLLM's model registry + ``packed_modules_mapping``):
how to read its architecture from a HF ``config.json`` or GGUF metadata into a :class:`ModelConfig`, the
name of its decoder layer (``model/layers/decoder.py``), and :class:`WeightNames` -- how a checkpoint's tensor
names map onto the model's, including which projections are fused (q/k/v into ``qkv_proj``, gate/up into
``gate_up_proj``). A family is plain data and config parsing, without torch: ``sluice validate`` reads a
checkpoint's config through the same families the engine loads it with (``checkpoint.py``).

HF configs come in two dialects: transformers 5's ``rope_parameters`` (what ``save_pretrained`` writes now)
and the Hub's older ``rope_theta`` + ``rope_scaling``; :func:`hf_rope` reads both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sluice.engines.llm.config import ModelConfig, RopeConfig
from sluice.engines.llm.loading.gguf_file import GGUFFile

PACKED_QKV_GATE_UP: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}

# GGUF per-layer tensor (blk.N.<name>) -> the model's module path, as llama.cpp's converter names them
GGUF_LLAMA_LAYER_NAMES: Mapping[str, str] = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # mixture-of-experts layers (Qwen3-MoE; Mixtral, which llama.cpp writes as a llama): stacked experts
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


@dataclass(frozen=True)
class WeightNames:
    """How a family's checkpoint tensors become the model's (``layers.0.self_attn.qkv_proj.weight``...)."""

    packed: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: PACKED_QKV_GATE_UP)
    # checkpoint-name prefixes of the decoder, tried in order (multimodal checkpoints nest the text model)
    hf_prefixes: tuple[str, ...] = ("model.",)
    hf_lm_head: tuple[str, ...] = ("lm_head.weight",)  # names of the LM head in HF checkpoints
    skipped: tuple[str, ...] = ("rotary_emb.inv_freq",)  # substrings of tensor names that are not loaded
    hf_renames: tuple[tuple[str, str], ...] = ()  # (old, new) substrings of HF tensor names, in order
    hf_experts: str = ""  # "gpt_oss": experts stacked (in, out), gate/up interleaved, maybe MXFP4 (quant/mxfp4.py)
    gguf_layer_names: Mapping[str, str] = field(default_factory=lambda: GGUF_LLAMA_LAYER_NAMES)
    gguf_permute_qk: bool = False  # llama.cpp's Llama converter interleaves Q/K rows; undo it
    hf_norm_plus_one: bool = False  # Gemma: HF stores w of a (1 + w) norm; the model keeps 1 + w


@dataclass(frozen=True)
class ModelFamily:
    """One registry entry: names that select it, its config parsers, decoder layer and weight names."""

    name: str
    hf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    config_from_gguf: Callable[[GGUFMetadata], ModelConfig] | None
    decoder_layer: str  # its block: a key of model/layers/decoder.py's DECODER_LAYERS ("llama", "gemma")
    weights: WeightNames = WeightNames()
    # for the docs' families table (docs/reference/families.md is generated from these)
    models: str = ""  # the published models it runs ("Llama 2 / 3.x, SmolLM2")
    differs: str = ""  # what differs from a Llama


class GGUFMetadata:
    """Typed access to a GGUF file's key/values and small tensors, per architecture."""

    def __init__(self, file: GGUFFile) -> None:
        self.file = file
        self.arch = str(file.get("general.architecture", ""))
        self.tensor_names = {t.name for t in file.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.file.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """``<arch>.<suffix>``, e.g. ``arch_get("block_count")``."""
        return self.get(f"{self.arch}.{suffix}", default)

    def require(self, suffix: str) -> Any:
        value = self.arch_get(suffix)
        if value is None:
            raise ValueError(f"GGUF metadata has no {self.arch}.{suffix}; the file is incomplete or not a model")
        return value

    def tensor(self, name: str) -> np.ndarray | None:
        """A tensor's values as float32, flattened (``rope_freqs.weight``...); None if absent."""
        for t in self.file.tensors:
            if t.name == name:
                return t.to_float32().reshape(-1)
        return None

    def tensor_shape(self, name: str) -> tuple[int, ...] | None:
        return next((t.shape for t in self.file.tensors if t.name == name), None)


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


# HF's activation names (transformers' ACT2FN) -> ModelConfig's; another name is refused
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh",
                  "gelu": "gelu", "relu": "relu"}  # fmt: skip


def hf_activation(cfg: dict[str, Any], default: str = "silu") -> str:
    """The MLP's activation: ``hidden_activation`` (Gemma's key) or ``hidden_act``; ValueError if unknown."""
    key = "hidden_activation" if cfg.get("hidden_activation") else "hidden_act"
    name = cfg.get(key) or default
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: {key} {name!r} is not supported (supported: {', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[name]


def refuse_prequantized(cfg: dict[str, Any], readable: tuple[str, ...] = ()) -> None:
    """A directory of GPTQ / AWQ / FP8 / bitsandbytes weights holds tensors no family's layers read;
    ``readable``: the methods the family dequantises at load (gpt-oss: mxfp4)."""
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        if method in readable:
            return
        raise ValueError(f"config.json: quantization_config (quant_method {method!r}) is not supported: the llm "
                         "engine reads unquantised HF weights (weights: int8 / int4 quantise them at load) "
                         "or GGUF files")  # fmt: skip


def hf_base(cfg: dict[str, Any], architecture: str, readable_quant: tuple[str, ...] = (), **defaults: Any
            ) -> dict[str, Any]:  # fmt: skip
    """The fields every family reads the same way from a HF config, as ``ModelConfig`` keyword arguments;
    ``defaults``: the family's HF config-class defaults for keys a config may omit. Refuses an unknown
    activation and pre-quantised weights (but those of ``readable_quant``)."""
    refuse_prequantized(cfg, readable_quant)
    cfg = {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, **defaults, **cfg}
    num_heads = int(cfg["num_attention_heads"])
    return dict(
        architecture=architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=hf_activation(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids(cfg.get("eos_token_id")),
    )


def hf_rope(cfg: dict[str, Any], params: dict[str, Any] | None = None, default_theta: float = 10000.0) -> RopeConfig:
    """A rope from HF config: ``params`` (one entry of per-layer-type ``rope_parameters``), else the config's
    ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (older configs)."""
    if params is None:
        params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    scaling = str(params.get("rope_type", params.get("type")) or "default")
    theta = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    original = params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    max_pos = int(cfg.get("max_position_embeddings", 2048))
    factor = params.get("factor")
    attention_factor = params.get("attention_factor", params.get("attn_factor"))
    if scaling == "yarn" and attention_factor is None and params.get("mscale") and params.get("mscale_all_dim"):
        attention_factor = _yarn_mscale(float(factor or 1.0), float(params["mscale"])) / _yarn_mscale(
            float(factor or 1.0), float(params["mscale_all_dim"])
        )
    if scaling in ("yarn", "longrope") and factor is None and original:
        factor = max_pos / int(original)  # HF: the context extension when no factor is given
    return RopeConfig(
        theta=theta,
        scaling=scaling,
        factor=float(factor if factor is not None else 1.0),
        original_max_position_embeddings=int(original) if original else None,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        short_factor=tuple(float(x) for x in params.get("short_factor") or ()),
        long_factor=tuple(float(x) for x in params.get("long_factor") or ()),
        attention_factor=None if attention_factor is None else float(attention_factor),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        partial_rotary_factor=partial,
    )


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * float(np.log(scale)) + 1.0


def hf_sliding_windows(
    cfg: dict[str, Any], num_layers: int, window: Any, sliding: Callable[[int], bool]
) -> tuple[int | None, ...]:
    """Per-layer windows: from ``layer_types`` when the config lists them, else ``sliding(layer)``."""
    types = cfg.get("layer_types")
    if types:
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
        if unknown:
            raise ValueError(f"config.json: layer_types {unknown} are not supported "
                             "(supported: sliding_attention, full_attention)")  # fmt: skip
    if window is None:
        return ()
    if types:
        flags = [t == "sliding_attention" for t in types]
    else:
        flags = [sliding(i) for i in range(num_layers)]
    windows = tuple(int(window) if flag else None for flag in flags)
    return windows if any(w is not None for w in windows) else ()


def gguf_base(meta: GGUFMetadata, architecture: str) -> dict[str, Any]:
    """The fields every family reads the same way from GGUF metadata, as ``ModelConfig`` keyword arguments."""
    hidden = int(meta.require("embedding_length"))
    num_heads = int(meta.require("attention.head_count"))
    vocab = meta.arch_get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    embedding = meta.tensor_shape("token_embd.weight")
    if embedding is not None:  # the converter may drop padding rows (Gemma 3)
        vocab = embedding[0]
    head_dim = meta.arch_get("attention.key_length") or hidden // num_heads
    num_kv_heads = meta.arch_get("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # per-layer counts; the engine needs them equal
        if len(set(num_kv_heads)) != 1:
            raise ValueError(f"GGUF {meta.arch}: per-layer KV head counts differ ({sorted(set(num_kv_heads))})")
        num_kv_heads = num_kv_heads[0]
    return dict(
        architecture=architecture,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta.require("feed_forward_length")),
        num_layers=int(meta.require("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(meta.arch_get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in meta.tensor_names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        # end of text, and of a turn or a message (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)
        eos_token_ids=tuple(dict.fromkeys(
            i for key in ("eos_token_id", "eot_token_id", "eom_token_id")
            for i in eos_ids(meta.get(f"tokenizer.ggml.{key}"))
        )),
    )  # fmt: skip


def gguf_rope(meta: GGUFMetadata, head_dim: int, theta_key: str = "rope.freq_base",
              default_theta: float = 10000.0) -> RopeConfig:  # fmt: skip
    """Plain, linear or yarn rope from GGUF metadata (llama.cpp stores llama3 and longrope factors as tensors,
    which the families that use them read themselves)."""
    kind = meta.arch_get("rope.scaling.type", "none")
    factor = float(meta.arch_get("rope.scaling.factor", 1.0) or 1.0)
    rotary = int(meta.arch_get("rope.dimension_count", head_dim))
    theta = float(meta.arch_get(theta_key, default_theta))
    partial = rotary / head_dim
    if kind in ("none", "") or (kind == "linear" and factor == 1.0):
        return RopeConfig(theta=theta, partial_rotary_factor=partial)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling="linear", factor=factor, partial_rotary_factor=partial)
    if kind == "yarn":
        return RopeConfig(
            theta=theta, scaling="yarn", factor=factor, partial_rotary_factor=partial,
            original_max_position_embeddings=int(meta.require("rope.scaling.original_context_length")),
            attention_factor=meta.arch_get("rope.scaling.yarn_attn_factor"),
            beta_fast=float(meta.arch_get("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(meta.arch_get("rope.scaling.yarn_beta_slow", 1.0)),
        )  # fmt: skip
    raise ValueError(f"GGUF {meta.arch}: rope scaling {kind!r} is not supported (supported: none, linear, yarn)")
