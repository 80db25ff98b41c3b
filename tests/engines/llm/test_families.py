"""Every supported family, from its HF directory and from llama.cpp's GGUF: greedy tokens equal HF's.

The reference is HF transformers' ``generate`` (fp32, greedy, one prompt at a time) on a tiny random model
of the family whose family-specific parts are all switched on and small enough to matter on short prompts:
llama3 rope scaling with a 32-token original context (Llama), a 12-token sliding window on every layer
(Mistral), q/k/v biases and tied embeddings (Qwen2), q/k norms with head_dim != hidden / heads (Qwen3),
soft-capped scores and logits and a 10-token window on alternate layers (Gemma 2), q/k norms, 5 local : 1
global layers with separate rope thetas and linear scaling on the global ones (Gemma 3), fused
checkpoints, partial rotary and LongRoPE switching at 32 tokens plus a 24-token window (Phi-3), all four
multipliers (Granite), two layers of eight without rotary (SmolLM3), post-norms and q/k norms across heads
(OLMo 2), 2 of 6 experts per token (Qwen3-MoE) and 2 of 4 (Mixtral). Prompts are
5-60 tokens, 28 tokens are generated (so every prompt crosses the windows and most cross the rope contexts).

Sluice must produce exactly HF's tokens with each scheduling feature off, with each on alone and with all
on together: prefix caching (a second run served from the cache), chunked prefill (16-token steps),
preemption (a KV pool too small for the batch) and speculative decoding (prompt-lookup drafts); and through
the attention path CUDA takes (its torch fallback here). Each run also asserts that its feature happened.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.loading.weights import load_weights
from tests.engines.llm.conftest import FAMILY_NEW_TOKENS, GGUF_FAMILIES, family_prompts
from tests.support.tiny_llms import FAMILIES

PARAMS = SamplingParams(max_tokens=FAMILY_NEW_TOKENS, ignore_eos=True)  # HF's reference runs without EOS
PREEMPTION_BLOCKS = 8  # fits the longest request (88 positions = 6 blocks), not the batch
OFF: dict[str, Any] = dict(enable_prefix_caching=False)
FEATURES: dict[str, dict[str, Any]] = {
    "plain": OFF,
    "prefix_caching": dict(enable_prefix_caching=True),
    "chunked_prefill": {**OFF, "max_num_batched_tokens": 16},
    "preemption": {**OFF, "kv_blocks": PREEMPTION_BLOCKS},
    "speculation": {**OFF, "num_speculative_tokens": 3, "speculative_adaptive": False},
    # the attention path CUDA takes (padded block tables, kernels.paged_attention), here its torch ops
    "kernel_path": {**OFF, "kernels": {"cpu_attention": "paged"}},
    "all": dict(enable_prefix_caching=True, max_num_batched_tokens=16, kv_blocks=PREEMPTION_BLOCKS,
                num_speculative_tokens=3, speculative_adaptive=False),
}  # fmt: skip
SOURCES = [(f, "hf") for f in FAMILIES] + [(f, "gguf") for f in GGUF_FAMILIES]
READ_FROM_GGUF_AS = {"mixtral": "llama"}  # llama.cpp's converter writes Mixtral as a llama with experts


def _engine(path: Path, options: dict[str, Any]) -> LLM:
    options = dict(options)
    blocks = options.pop("kv_blocks", None)
    if blocks is not None:
        cfg = load_weights(path)[0]
        bytes_per_block = 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 4  # fp32, block size 16
        options["kv_cache_memory_bytes"] = blocks * bytes_per_block
    return LLM(path, **options)


def _check_greedy(llm: LLM, prompts: list[list[int]], expected: list[list[int]], feature: str) -> None:
    outputs = llm.generate(prompts, PARAMS)
    assert [o.token_ids for o in outputs] == expected
    options = FEATURES[feature]
    stats = llm.stats
    if options.get("enable_prefix_caching"):
        again = llm.generate(prompts, PARAMS)
        assert [o.token_ids for o in again] == expected, "a prefix-cache hit changed the tokens"
        assert sum(o.num_cached_tokens for o in again) > 0
    if "max_num_batched_tokens" in options:
        assert stats.num_steps > sum(map(len, prompts)) // options["max_num_batched_tokens"]
    if "kv_blocks" in options:
        assert stats.num_preemptions > 0
    if options.get("num_speculative_tokens"):
        # verify steps ran (1 + k query rows through the windows and soft-caps); how many drafts a random
        # model accepts varies, and an emitted target is as much a check as an accepted draft
        assert stats.num_draft_tokens > 0


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize(("family", "source"), SOURCES, ids=[f"{f}-{s}" for f, s in SOURCES])
def test_greedy_tokens_equal_hf(
    family: str, source: str, feature: str, tiny_family_dir: Callable[..., Path],
    tiny_family_gguf: Callable[[str], Path], hf_greedy: Callable[..., list[list[int]]],
) -> None:  # fmt: skip
    path = tiny_family_dir(family) if source == "hf" else tiny_family_gguf(family)
    llm = _engine(path, FEATURES[feature])
    assert llm.model_config.architecture == (READ_FROM_GGUF_AS.get(family, family) if source == "gguf" else family)
    _check_greedy(llm, family_prompts(llm.model_config.vocab_size), hf_greedy(family), feature)


def test_gemma2_query_pre_attn_scalar_other_than_head_dim(
    tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]]
) -> None:
    """Gemma 2 27B scales queries by hidden / heads (144), not head_dim (128); HF dirs carry the scalar."""
    path = tiny_family_dir("gemma2", query_pre_attn_scalar=40)
    llm = _engine(path, OFF)
    assert llm.model_config.attn_scale == pytest.approx(40**-0.5)
    _check_greedy(llm, family_prompts(llm.model_config.vocab_size), hf_greedy("gemma2", query_pre_attn_scalar=40),
                  "plain")  # fmt: skip


@pytest.mark.parametrize(("family", "activation"), [("llama", "gelu"), ("qwen3", "gelu_pytorch_tanh"),
                                                    ("mistral", "relu"), ("phi3", "silu")])  # fmt: skip
def test_the_mlp_runs_the_activation_the_config_names(
    family: str, activation: str, tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]]
) -> None:
    """Every family reads hidden_act (it once ran SiLU whatever a Llama-shaped config said)."""
    path = tiny_family_dir(family, hidden_act=activation)
    llm = _engine(path, OFF)
    expected = hf_greedy(family, hidden_act=activation)
    _check_greedy(llm, family_prompts(llm.model_config.vocab_size), expected, "plain")


@pytest.mark.parametrize("overrides", [
    dict(norm_topk_prob=False, mlp_only_layers=[1]),  # HF's default routing; a dense layer among sparse ones
    dict(decoder_sparse_step=2, use_sliding_window=True, sliding_window=10),  # every other layer sparse
], ids=["unnormalised-dense-layer", "sparse-step-window"])  # fmt: skip
def test_qwen3_moe_layouts_from_hf(
    overrides: dict[str, Any], tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]]
) -> None:
    """Qwen3-MoE's other layouts, with every scheduling feature on (llama.cpp writes neither to GGUF)."""
    path = tiny_family_dir("qwen3_moe", **overrides)
    llm = _engine(path, FEATURES["all"])
    assert llm.model_config.num_experts == 6
    _check_greedy(llm, family_prompts(llm.model_config.vocab_size), hf_greedy("qwen3_moe", **overrides), "all")


def test_gpt_oss_from_gguf(tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]],
                           tmp_path: Path) -> None:  # fmt: skip
    """gpt-oss as llama.cpp's converter writes it (sinks, split gate/up experts with biases, the pre-MLP norm
    named post_attention_norm), every scheduling feature on. GGUF has no key for the SwiGLU clamp (llama.cpp
    fixes it at 7), so this model has that clamp; the HF parity tests cover one that bites."""
    from tests.support.llama_cpp import convert

    path = convert(tiny_family_dir("gpt_oss", swiglu_limit=7.0), tmp_path / "gpt-oss.gguf")
    llm = _engine(path, FEATURES["all"])
    assert llm.model_config.architecture == "gpt_oss" and llm.model_config.attention_sinks
    _check_greedy(llm, family_prompts(llm.model_config.vocab_size), hf_greedy("gpt_oss", swiglu_limit=7.0), "all")
