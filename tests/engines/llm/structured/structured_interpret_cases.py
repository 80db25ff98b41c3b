"""The bitmask kernel and constrained decoding through the Triton kernels, under the Triton CPU interpreter.

Not collected by the main test run: ``test_structured_triton_interpret.py`` runs this file in a child pytest
with ``TRITON_INTERPRET=1`` (the interpreter must be chosen before kernels are decorated, and must not leak
into the rest of the suite); the engine here names the Triton kernels in its configuration.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run through test_structured_triton_interpret.py (needs TRITON_INTERPRET=1)",
                allow_module_level=True)

from sluice.engines.llm import LLM, SamplingParams  # noqa: E402
from sluice.engines.llm.kernels import kernel_path  # noqa: E402
from sluice.engines.llm.structured import bitmask as bitmask_module  # noqa: E402
from sluice.engines.llm.structured.bitmask import TokenBitmask, apply_token_bitmask_  # noqa: E402
from sluice.engines.llm.structured.triton_bitmask import apply_token_bitmask_triton  # noqa: E402
from tests.engines.llm.structured.test_bitmask import loop_reference  # noqa: E402
from tests.engines.llm.structured.test_constrained_decoding import MAX_TOKENS, accepting, prompts  # noqa: E402


@pytest.mark.parametrize(("num_rows", "vocab", "num_words", "rows"),
                         [(3, 100, 4, [2, 0]), (5, 2100, 66, [0, 1, 2, 3, 4]), (4, 300, 5, [3])],
                         ids=["subset", "two-blocks", "mask-narrower-than-vocab"])
def test_bitmask_kernel_matches_the_loop(num_rows: int, vocab: int, num_words: int, rows: list[int]) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(num_rows, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31, (len(rows), num_words), generator=gen, dtype=torch.int64).to(torch.int32)
    expected = loop_reference(logits, bitmask, rows)
    apply_token_bitmask_triton(logits, bitmask, torch.tensor(rows))
    torch.testing.assert_close(logits, expected)
    transposed = logits.new_empty(vocab, num_rows).t()  # a column-major view, as a matmul may return
    transposed.copy_(logits)
    apply_token_bitmask_triton(transposed, bitmask, torch.tensor(rows))
    torch.testing.assert_close(transposed, expected)


def test_dispatch_takes_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = torch.randn(2, 40)
    assert kernel_path(logits) == "torch"  # the CPU's default; the engine's plan names triton
    monkeypatch.setattr(bitmask_module, "apply_token_bitmask_torch", None)  # called: a TypeError
    bitmask = torch.tensor([[0b1010, 0]], dtype=torch.int32)
    apply_token_bitmask_(logits, TokenBitmask(bitmask, torch.tensor([1])), "triton")
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [1, 3] and torch.isfinite(logits[0]).all()


@pytest.mark.parametrize("speculative", [0, 3], ids=["plain", "speculative"])
def test_constraints_that_accept_the_greedy_answer_reproduce_it_through_the_kernels(
    tiny_llama_dir: Callable[[bool], Path], speculative: int
) -> None:
    batch = prompts(4, seed=11)
    llm = LLM(tiny_llama_dir(False), kv_cache_memory_bytes=1 << 22, num_speculative_tokens=speculative,
              speculative_adaptive=False,  # the CUDA path: Triton store_kv, paged attention and bitmask
              kernels={"attention": "triton", "cpu_attention": "paged", "native_cpu": False})
    assert llm.runner.sampler.kernel_path == "triton"
    drafter, llm.scheduler.drafter = llm.scheduler.drafter, None
    plain = llm.generate(batch, SamplingParams(max_tokens=MAX_TOKENS))
    llm.scheduler.drafter = drafter
    got = llm.generate(batch, accepting(plain, seed=12))
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    assert llm.stats.structured is not None and llm.stats.structured.num_mask_steps > 0
    if speculative:
        assert llm.stats.num_accepted_draft_tokens > 0
