"""The LLM step's workloads and its reference: HF transformers ``generate`` on the same weights and device.

* :func:`parity_prompts` -- random token prompts of ragged lengths (no tokenizer: the models are random).
* :func:`labelling_workload` -- review labelling as a token workload: one shared system prompt, a short
  review per request, each request its own ``max_tokens`` (1..``max_new``; EOS ignored, so both engines
  produce exactly ``sum(max_tokens)`` useful tokens), like ``bench/llm.py`` on the CPU.
* :func:`hf_greedy` -- greedy continuations one prompt at a time (no padding: the cleanest reference).
* :func:`hf_static` -- static batches in arrival order, left-padded; a batch runs until its longest
  member's ``max_tokens`` (what static batching costs), and only each request's own tokens count.
* :func:`first_divergence` -- where two token lists first differ.
"""

from __future__ import annotations

import time
from typing import Any

PAD_ID = 0


def _random_ids(gen: Any, vocab_size: int, n: int) -> list[int]:
    import torch

    return torch.randint(0, vocab_size, (n,), generator=gen).tolist()


def parity_prompts(vocab_size: int, num_prompts: int, seed: int = 7) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = (1, 5, 16, 17, 33, 70, 128, 200)
    return [_random_ids(gen, vocab_size, lengths[i % len(lengths)]) for i in range(num_prompts)]


def labelling_workload(vocab_size: int, num_prompts: int, system_len: int, review_lens: tuple[int, int],
                       max_new: int, seed: int = 11) -> tuple[list[list[int]], list[int]]:
    """(prompts, max_tokens): ``system_len`` shared tokens + a review of ``review_lens`` tokens each."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    system = _random_ids(gen, vocab_size, system_len)
    low, high = review_lens
    prompts, max_tokens = [], []
    for i in range(num_prompts):
        review_len = low + (i * 29) % (high - low + 1)  # deterministic spread
        prompts.append(system + _random_ids(gen, vocab_size, review_len))
        max_tokens.append(1 + (i * 37) % max_new)
    return prompts, max_tokens


def hf_greedy(model: Any, prompts: list[list[int]], num_new: int, device: str) -> list[list[int]]:
    import torch

    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_new,
                                 do_sample=False, pad_token_id=PAD_ID)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def hf_static(model: Any, prompts: list[list[int]], max_tokens: list[int], batch_size: int,
              device: str) -> dict[str, Any]:
    """Time the workload in static batches of ``batch_size``; tokens/s counts only each request's own."""
    import torch

    def run(batch: list[list[int]], new_tokens: int) -> None:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=PAD_ID)

    run(prompts[:2], 2)  # warm-up
    computed = 0
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        longest = max(max_tokens[b:b + batch_size])
        run(prompts[b:b + batch_size], longest)
        computed += len(prompts[b:b + batch_size]) * longest
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "output_tokens": sum(max_tokens), "tokens_computed": computed,
            "tok_s": round(sum(max_tokens) / seconds, 1)}


def first_divergence(got: list[int], want: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), or None when equal."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def parity_summary(got: list[list[int]], want: list[list[int]]) -> dict[str, Any]:
    """Exact sequences, and where the others first diverge (median, min) and how much of them matched."""
    firsts = [first_divergence(g, w) for g, w in zip(got, want, strict=True)]
    diverged = sorted(f for f in firsts if f is not None)
    total = sum(len(w) for w in want)
    matched = sum(len(w) if f is None else f for f, w in zip(firsts, want, strict=True))
    return {"prompts": len(want), "exact": len(want) - len(diverged),
            "first_divergence_min": diverged[0] if diverged else None,
            "first_divergence_median": diverged[len(diverged) // 2] if diverged else None,
            "matched_prefix_share": round(matched / total, 4) if total else None,
            "first_divergence": firsts}
