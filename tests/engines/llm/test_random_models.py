"""Random checkpoints of the published Llama-3.2-1B and Qwen3-0.6B shapes load and compute as HF's.

``save_random_model`` is what the GPU check uses to build those decoders with random bf16 weights; here the
same presets are cut to 2 layers (widths, vocabularies, rope settings and tying as published) so that the
check of config parsing and weight names at the real shapes stays a few seconds on a CPU: the bf16
checkpoint written by ``save_pretrained`` is loaded by Sluice and by HF in fp32, and the next-token log-probs
of a prompt must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM
from sluice.engines.llm.model.causal_lm import LlamaModel
from sluice.engines.llm.random_models import PRESETS, save_random_model


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "qwen3-0.6b"])
def test_published_shapes_load_and_match_hf(
    preset: str, tmp_path: Path, next_logprobs: Callable[[LlamaModel, list[int]], torch.Tensor]
) -> None:
    from transformers import AutoModelForCausalLM

    path = save_random_model(tmp_path, preset, dtype=torch.bfloat16, num_hidden_layers=2)
    llm = LLM(path, dtype="float32", kv_cache_memory_bytes=1 << 24, enable_prefix_caching=False)
    cfg, published = llm.model_config, PRESETS[preset]
    assert (cfg.vocab_size, cfg.hidden_size, cfg.head_dim, cfg.num_kv_heads) == (
        published["vocab_size"], published["hidden_size"], published["head_dim"], published["num_key_value_heads"]
    )  # fmt: skip
    assert cfg.tie_word_embeddings and cfg.rope.scaling == published["rope_parameters"]["rope_type"]
    prompt = torch.randint(0, cfg.vocab_size, (23,), generator=torch.Generator().manual_seed(5)).tolist()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], dim=-1)
    torch.testing.assert_close(next_logprobs(llm.runner.model, prompt), expected, atol=2e-4, rtol=0)
