"""Greedy parity of Sluice's LLM engine with HF transformers ``generate`` (the independent reference).

(a) Tiny random Llamas (tied and untied embeddings), loaded through our safetensors loader: every
    sequence must match HF exactly for 32 tokens, all prompts batched together in our engine.
(b) SmolLM2-135M-Instruct from its Q4_1 GGUF (our dequantiser and Q/K un-permutation vs HF's own GGUF
    loading), 16 chat prompts, 32 greedy tokens: where a token differs, each side's token must be in the
    other's top-5 and the comparison of that sequence stops there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.model.causal_lm import LlamaModel

NUM_NEW_TOKENS = 32

SMOL_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Label this review as positive or negative: The battery died after two days.",
    "Explain photosynthesis in one sentence.",
    "List three colours of the rainbow.",
    "Translate 'good morning' into Spanish.",
    "What is 12 plus 30?",
    "Give me a name for a pet goldfish.",
    "Summarise: The meeting was moved to Friday because the manager was ill.",
    "Is a tomato a fruit or a vegetable?",
    "Write one sentence about the ocean.",
    "Classify the sentiment: I love this phone, the camera is amazing!",
    "What does CPU stand for?",
    "Suggest a title for a blog post about baking bread.",
    "Extract the city from: 'Shipping to Berlin by Monday'.",
    "Why is the sky blue? Answer briefly.",
]


def _hf_greedy(hf_model: torch.nn.Module, prompt: list[int], eos: int | None) -> list[int]:
    out = hf_model.generate(  # type: ignore[operator]
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=NUM_NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0,
    )  # fmt: skip
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_tiny_llama_greedy_matches_hf_exactly(tiny_llama_dir: Callable[[bool], Path], tie: bool) -> None:
    from transformers import LlamaForCausalLM

    path = tiny_llama_dir(tie)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (1, 5, 16, 17, 33, 70)]
    with torch.inference_mode():
        expected = [_hf_greedy(hf, p, eos=None) for p in prompts]

    llm = LLM(path, kv_cache_memory_bytes=1 << 22)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS))
    assert [o.token_ids for o in outputs] == expected
    assert all(o.finish_reason == "length" for o in outputs)


@pytest.fixture(scope="module")
def smol_engine(smollm2_gguf: Path) -> LLM:
    return LLM(smollm2_gguf, weights="fp32")  # the dequantiser and loader against HF's own GGUF loading


@pytest.mark.slow  # ./dev test fast leaves it out
def test_smollm2_gguf_greedy_parity_with_hf(
    smollm2_gguf: Path, smol_engine: LLM, next_logprobs: Callable[[LlamaModel, list[int]], torch.Tensor]
) -> None:
    from transformers import AutoModelForCausalLM

    tok = smol_engine.tokenizer
    assert tok is not None
    prompts = [tok.encode(smol_engine.apply_chat_template([{"role": "user", "content": q}])) for q in SMOL_QUESTIONS]
    ours = [o.token_ids for o in smol_engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS))]

    hf = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()
    eos = smol_engine.model_config.eos_token_ids[0]
    num_exact = 0
    with torch.inference_mode():
        for prompt, mine in zip(prompts, ours, strict=True):
            ref = _hf_greedy(hf, prompt, eos=eos)
            if mine == ref:
                num_exact += 1
                continue
            i = next((k for k, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b), None)
            assert i is not None, f"one output is a strict prefix of the other: {mine} vs {ref}"
            context = prompt + mine[:i]
            hf_top5 = torch.log_softmax(hf(torch.tensor([context])).logits[0, -1], dim=-1).topk(5).indices
            our_top5 = next_logprobs(smol_engine.runner.model, context).topk(5).indices
            assert mine[i] in hf_top5.tolist(), f"token {i}: ours {mine[i]} not in HF top-5 {hf_top5.tolist()}"
            assert ref[i] in our_top5.tolist(), f"token {i}: HF's {ref[i]} not in our top-5 {our_top5.tolist()}"
    print(f"\nSmolLM2 GGUF greedy parity: {num_exact}/{len(prompts)} sequences match HF exactly")
    # Rounding differs (fused projections, attention kernels), but most sequences must be identical.
    assert num_exact >= len(prompts) // 2


@pytest.mark.slow
def test_smollm2_auto_weights_follow_the_dequantised_model(
    smollm2_gguf: Path, smol_engine: LLM, next_logprobs: Callable[[LlamaModel, list[int]], torch.Tensor]
) -> None:
    """``weights: auto`` (Q4_1 projections repacked to int4, the Q8_0 head as int8 with its top candidates
    rescored, bf16 KV) against the same file dequantised to float32 (``smol_engine``), greedy on the parity
    prompts: most sequences equal throughout, and where one first differs, the float32 model was near a tie
    there (its log-prob of the packed model's token within 0.5 of its own choice, and that token in its top 3).
    Prints the first-divergence statistics (seen: 10/16 equal, the 6 others parting at gaps of 0.0-0.09)."""
    packed = LLM(smollm2_gguf, kv_cache_memory_bytes=64 << 20)
    tok = smol_engine.tokenizer
    assert tok is not None
    prompts = [tok.encode(smol_engine.apply_chat_template([{"role": "user", "content": q}])) for q in SMOL_QUESTIONS]
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    ours = [o.token_ids for o in packed.generate(prompts, params)]
    reference = [o.token_ids for o in smol_engine.generate(prompts, params)]
    divergences = []
    for prompt, mine, ref in zip(prompts, ours, reference, strict=True):
        i = next((k for k, (a, b) in enumerate(zip(mine, ref, strict=True)) if a != b), None)
        if i is None:
            continue
        lp = next_logprobs(smol_engine.runner.model, prompt + ref[:i])
        gap = float(lp[ref[i]] - lp[mine[i]])
        divergences.append((i, gap))
        assert gap < 0.5 and mine[i] in lp.topk(3).indices.tolist(), f"token {i}: gap {gap:.3f}"
    print(f"\nSmolLM2 weights auto vs fp32: {len(prompts) - len(divergences)}/{len(prompts)} greedy sequences equal "
          f"for {NUM_NEW_TOKENS} tokens; first divergences (token, fp32 log-prob gap): "
          f"{[(i, round(g, 3)) for i, g in divergences]}")  # fmt: skip
    assert len(divergences) <= len(prompts) // 2
