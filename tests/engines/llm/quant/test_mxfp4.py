"""gpt-oss's MXFP4 experts: dequantised as transformers does, and a checkpoint holding them runs as HF does
on the same weights in float."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.loading.gguf_file import GGUFFile
from sluice.engines.llm.model.layers.moe import PackedStacked
from sluice.engines.llm.quant.mxfp4 import dequantize_mxfp4
from sluice.engines.llm.quant.packed import Int8Weight
from tests.support.llama_cpp import convert
from tests.support.tiny_llms import save_tiny_model

MXFP4 = 39  # GGML's type id


def _random_mxfp4(experts: int, out: int, inputs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.randint(0, 256, (experts, out, inputs // 32, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(121, 128, (experts, out, inputs // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def test_dequantised_as_transformers_does() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4(3, 40, 96, torch.Generator().manual_seed(0))
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    got = dequantize_mxfp4(blocks, scales)
    assert got.shape == (3, 96, 40) and torch.equal(got, expected)


def test_a_checkpoint_with_mxfp4_experts_equals_hf_on_its_float_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The float directory is what HF runs; the MXFP4 directory holds the same experts as blocks and scales
    (the published checkpoints' form, with their quantization_config) and is what Sluice runs, as it is and
    as llama.cpp's converter writes it to GGUF (MXFP4 tensors). The clamp is llama.cpp's fixed 7."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    float_dir = save_tiny_model(tmp_path / "float", "gpt_oss", seed=2, swiglu_limit=7.0)
    tensors = load_file(str(float_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    packed = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, out = tensors[name].shape  # HF's (experts, in, out)
        blocks, scales = _random_mxfp4(experts, out, inputs, gen)
        tensors[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    save_file(tensors, str(float_dir / "model.safetensors"))
    mxfp4_dir = tmp_path / "mxfp4"
    mxfp4_dir.mkdir()
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "lm_head"]}
    (mxfp4_dir / "config.json").write_text(json.dumps(config))
    for tokenizer_file in float_dir.glob("tokenizer*"):
        shutil.copy(tokenizer_file, mxfp4_dir)
    kept = {n: t for n, t in tensors.items() if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    save_file({**kept, **packed}, str(mxfp4_dir / "model.safetensors"))

    hf = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=gen).tolist() for n in (6, 30)]
    with torch.inference_mode():
        expected = [hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(p):].tolist() for p in prompts]  # fmt: skip
    gguf = convert(mxfp4_dir, tmp_path / "gpt-oss-mxfp4.gguf")
    assert any(t.tensor_type == MXFP4 for t in GGUFFile(gguf).tensors)
    for path in (mxfp4_dir, gguf):  # fp32: the GGUF's MXFP4 experts dequantised, not packed as auto does
        with caplog.at_level("WARNING", logger="sluice.engines.llm.model.causal_lm"):
            llm = LLM(path, enable_prefix_caching=False, weights="fp32")
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
        assert [o.token_ids for o in outputs] == expected, path.name
    # the user is told what keeping a file's quantised experts in float costs in memory
    assert "the quantised experts take" in caplog.text and "(weights: fp32; auto or int4 keep them" in caplog.text
    # auto keeps the GGUF's MXFP4 experts packed (int8: no int4 kernel reads MXFP4 as it is)
    experts = LLM(gguf, enable_prefix_caching=False).runner.model.layers[0].mlp.experts
    assert isinstance(experts.gate_up_proj, PackedStacked)
    assert all(isinstance(w, Int8Weight) for w in experts.gate_up_proj.experts)
