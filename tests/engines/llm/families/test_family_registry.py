"""The architecture seam: which checkpoints are accepted, how their configs read, what is refused.

Configs on the Hub are in the older dialect (``rope_theta`` + ``rope_scaling``, ``sliding_window_pattern``,
``type: su``); transformers 5's ``save_pretrained`` writes ``rope_parameters`` and ``layer_types``. Both must
give the same architecture. An unsupported checkpoint is refused at start in one line that names what is
supported. A multimodal Gemma 3 checkpoint runs its text model (the vision tower is not loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.loading.checkpoint import model_config_from_hf
from sluice.engines.llm.random_models import save_random_model

_SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
              max_position_embeddings=8192, bos_token_id=2, eos_token_id=[1, 3], rms_norm_eps=1e-5)  # fmt: skip
HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(_SMALL, num_hidden_layers=2, tie_word_embeddings=True, max_position_embeddings=131072,
                  rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "qwen2": dict(_SMALL, num_hidden_layers=4, rope_theta=1000000.0, use_sliding_window=True, sliding_window=16,
                  max_window_layers=2),
    "gemma2": dict(_SMALL, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=144, sliding_window=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3_text": dict(_SMALL, num_hidden_layers=12, head_dim=16, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window=512,
                        sliding_window_pattern=6),
    "phi3": dict(_SMALL, num_hidden_layers=2, max_position_embeddings=131072, original_max_position_embeddings=4096,
                 partial_rotary_factor=0.75, tie_word_embeddings=True,
                 rope_scaling=dict(type="su", short_factor=[1.0] * 6, long_factor=[2.0] * 6,
                                   original_max_position_embeddings=4096)),
}  # fmt: skip


@pytest.mark.parametrize("model_type", list(HUB_CONFIGS))
def test_hub_and_transformers5_configs_give_the_same_architecture(model_type: str) -> None:
    from transformers import AutoConfig

    hub = {"model_type": model_type, **HUB_CONFIGS[model_type]}
    saved = AutoConfig.for_model(model_type, **HUB_CONFIGS[model_type]).to_dict()
    assert model_config_from_hf(hub) == model_config_from_hf(saved)


def test_hub_configs_read_as_their_families_run() -> None:
    llama = model_config_from_hf({"model_type": "llama", **HUB_CONFIGS["llama"]})
    assert (llama.rope.scaling, llama.rope.factor, llama.tie_word_embeddings) == ("llama3", 32.0, True)
    qwen2 = model_config_from_hf({"model_type": "qwen2", **HUB_CONFIGS["qwen2"]})
    assert qwen2.sliding_windows == (None, None, 16, 16) and qwen2.qkv_bias and not qwen2.o_bias
    gemma2 = model_config_from_hf({"model_type": "gemma2", **HUB_CONFIGS["gemma2"]})
    assert gemma2.sliding_windows == (4096, None, 4096, None) and gemma2.attn_scale == 144**-0.5
    gemma3 = model_config_from_hf({"model_type": "gemma3_text", **HUB_CONFIGS["gemma3_text"]})
    assert [w is None for w in gemma3.sliding_windows] == [False] * 5 + [True] + [False] * 5 + [True]
    assert gemma3.layer_rope(0).theta == 10000.0 and gemma3.layer_rope(5).theta == 1000000.0
    assert gemma3.layer_rope(5).scaling == "linear" and gemma3.layer_rope(0).scaling == "default"
    phi = model_config_from_hf({"model_type": "phi3", **HUB_CONFIGS["phi3"]})
    assert phi.rope.scaling == "longrope" and phi.rope.rotary_dim(phi.head_dim) == 12
    assert phi.long_rope_switch_len == 4096 and phi.rope.factor == 32.0


def _dir_with_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _dir_with_config(tmp_path, {"architectures": ["FalconForCausalLM"], "model_type": "falcon"})
    with pytest.raises(ValueError) as err:
        LLM(path)
    message = str(err.value)
    assert "\n" not in message and "'FalconForCausalLM' is not supported" in message
    for supported in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"):
        assert supported in message


def test_an_unsupported_gguf_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "falcon.gguf"
    writer = GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError) as err:
        LLM(path)
    message = str(err.value)
    assert "\n" not in message and "'falcon' is not supported" in message and "qwen3" in message


@pytest.mark.slow  # ./dev test fast leaves it out
def test_gemma3_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    text = dict(_SMALL, num_hidden_layers=6, head_dim=16, sliding_window=10, query_pre_attn_scalar=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)  # fmt: skip
    path = save_random_model(tmp_path, dict(model_type="gemma3", text_config=text, vision_config=vision,
                                            mm_tokens_per_image=4), weight_std=0.15)  # fmt: skip
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Gemma3ForConditionalGeneration"]
    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 400, (n,), generator=gen).tolist() for n in (7, 30)]
    with torch.inference_mode():
        expected = [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
                                )[0, len(p):].tolist() for p in prompts]  # fmt: skip
    llm = LLM(path, enable_prefix_caching=False)
    assert llm.model_config.architecture == "gemma3"
    outputs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected


def test_a_hf_directory_stops_on_its_generation_config_eos_too(tmp_path: Path) -> None:
    """Gemma's chat models end a turn with <end_of_turn>, listed only in generation_config.json."""
    from sluice.engines.llm.loading.weights import load_weights

    path = save_random_model(tmp_path, "tiny-gemma2", vocab_size=300, eos_token_id=1)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 107]}))
    assert load_weights(path)[0].eos_token_ids == (1, 107)


def test_every_family_names_a_decoder_layer_the_model_builds() -> None:
    """Families are torch-free data (``sluice validate`` reads them); their blocks are in model/layers/decoder.py."""
    from sluice.engines.llm.model.families.family_registry import FAMILIES
    from sluice.engines.llm.model.layers.decoder import DECODER_LAYERS

    assert {f.name: f.decoder_layer in DECODER_LAYERS for f in FAMILIES} == {f.name: True for f in FAMILIES}
    assert {f.decoder_layer for f in FAMILIES} == set(DECODER_LAYERS)  # and no block is left unused
