"""No config field is silently ignored: each one a family's HF config class has is honoured or refused.

For every supported family the test takes its transformers config class, and for every field of it that can
change a forward pass it builds the config again with that field changed (through the class, so that fields
it derives from others follow, as they would in a saved ``config.json``). The engine must then read another
architecture (the field is honoured: the family parity tests check how) or refuse the config in one line.
A field that changes nothing is one the engine would run with the arithmetic of its default -- the bug of
a gelu Llama run as SiLU. New fields in a transformers upgrade fail here until they are classified.

Also: a ``config.json`` that omits every optional field reads as the class's defaults do (the families'
defaults are HF's).
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.loading.checkpoint import model_config_from_hf
from sluice.engines.llm.model.families.family_registry import FAMILIES

# Fields that never change what an inference forward pass computes: identity, bookkeeping, output flags,
# dropout, training losses and router noise (off in eval), the storage dtype (the engine's own dtype option decides), and
# pretraining_tp (HF's tensor-parallel slicing of the same matmuls).
INERT = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type",
    "is_encoder_decoder", "chunk_size_feed_forward", "pad_token_id", "initializer_range", "attention_dropout",
    "embd_pdrop", "resid_pdrop", "pretraining_tp", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "tie_encoder_decoder", "_sliding_window_pattern",
})  # fmt: skip

# A field that takes effect only with another set (HF ignores it too otherwise): the other's value
ENABLED_BY: dict[str, dict[str, Any]] = {
    "sliding_window": {"use_sliding_window": True, "max_window_layers": 1},
    "max_window_layers": {"use_sliding_window": True, "sliding_window": 8},
    "use_sliding_window": {"sliding_window": 8, "max_window_layers": 1},
    "layer_types": {"use_sliding_window": True, "sliding_window": 8},
    "no_rope_layer_interval": {"no_rope_layers": None},
}
# where the generic change would fall outside 4 layers, or an empty list has no other value of its own
VARIATIONS: dict[str, Any] = {"max_window_layers": 2, "mlp_only_layers": [0]}
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
MODEL_TYPES = {f.name: "gemma3_text" if f.name == "gemma3" else f.hf_model_types[0] for f in FAMILIES}


def _class_config(model_type: str, **fields: Any) -> dict[str, Any]:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**SMALL, **fields}).to_dict()


def _changed(key: str, value: Any) -> list[Any]:
    """Other values of the field's type, ones a model could plausibly carry (the first the class takes)."""
    if key in VARIATIONS:
        return [VARIATIONS[key]]
    if value is None:
        return [8, 8.0, True]  # head_dim, sliding_window, bos/eos ids; soft-caps; flags
    return [_other(key, value)]


def _other(key: str, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 2
    if isinstance(value, float):
        return value * 1.5 + 0.01
    if isinstance(value, str):
        return f"unheard-of-{value}"
    if isinstance(value, list) and value and isinstance(value[0], str):  # layer_types
        flip = {"full_attention": "sliding_attention", "sliding_attention": "full_attention"}
        return [flip.get(value[0], "full_attention"), *value[1:]]
    if isinstance(value, list):  # no_rope_layers, eos ids
        return [1 - v if v in (0, 1) else v + 1 for v in value[:1]] + value[1:]
    if isinstance(value, dict):  # rope_parameters: another theta (per layer type for Gemma 3)
        if "rope_theta" in value:
            return {**value, "rope_theta": float(value["rope_theta"]) * 2}
        return {k: _other(k, v) for k, v in value.items()}
    raise AssertionError(f"no variation for {key}={value!r}")


def _read(cfg: dict[str, Any]) -> ModelConfig | str:
    try:
        return model_config_from_hf(cfg)
    except ValueError as err:
        return f"refused: {err}"


@pytest.mark.parametrize("family", sorted(MODEL_TYPES))
def test_every_field_of_the_family_config_class_is_honoured_or_refused(family: str) -> None:
    model_type = MODEL_TYPES[family]
    reference_fields = _class_config(model_type)
    reference = model_config_from_hf(reference_fields)
    ignored = []
    for key, value in reference_fields.items():
        if key in INERT or key in SMALL and key != "max_position_embeddings":
            continue  # the shape fields are read by every family (a wrong shape fails to load)
        enablers = ENABLED_BY.get(key, {})
        base = model_config_from_hf(_class_config(model_type, **enablers)) if enablers else reference
        cfg = None
        for changed in _changed(key, value):
            try:
                cfg = _class_config(model_type, **{**enablers, key: changed})
                break
            except Exception:  # the config class itself rejects the value: no checkpoint can carry it
                continue
        if cfg is None:
            continue
        got = _read(cfg)
        if isinstance(got, str):
            assert "\n" not in got, f"{family}: {key}: the refusal is not one line: {got}"
        elif got == base:
            ignored.append(f"{key}={cfg.get(key)!r}")
    assert not ignored, f"{family}: read as if absent: {', '.join(ignored)}"


@pytest.mark.parametrize("family", sorted(MODEL_TYPES))
def test_a_config_without_optional_fields_reads_as_the_class_defaults(family: str) -> None:
    model_type = MODEL_TYPES[family]
    minimal = model_config_from_hf({"model_type": model_type, **SMALL})
    full = model_config_from_hf(_class_config(model_type))
    # token ids are not arithmetic, and a checkpoint's tokenizer and generation_config name them too
    fields = set(ModelConfig.__dataclass_fields__) - {"bos_token_id", "eos_token_ids"}
    differ = {k: (getattr(minimal, k), getattr(full, k)) for k in fields if getattr(minimal, k) != getattr(full, k)}
    assert not differ, f"{family}: (omitted, class default) differ: {differ}"


@pytest.mark.parametrize("name", ["gelu_new", "tanh", "relu2"])
def test_an_activation_the_engine_lacks_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match=f"hidden_act '{name}' is not supported.*silu"):
        model_config_from_hf({"model_type": "llama", **SMALL, "hidden_act": name})


def test_prequantised_weights_are_refused_naming_the_method() -> None:
    cfg = {"model_type": "qwen3", **SMALL, "quantization_config": {"quant_method": "gptq", "bits": 4}}
    with pytest.raises(ValueError, match="quant_method 'gptq'.*GGUF"):
        model_config_from_hf(cfg)
