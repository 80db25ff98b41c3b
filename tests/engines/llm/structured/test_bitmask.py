"""Applying token bitmasks: the torch path against a per-token loop, on random masks and row subsets.

The Triton kernel is checked against the same loop under the interpreter (interpret_cases.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm.structured.bitmask import TokenBitmask, apply_token_bitmask_, unpack_bitmask


def loop_reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Token by token: keep a logit iff its bit is set (tokens past the mask's words are disallowed)."""
    out = logits.clone()
    num_words = bitmask.shape[1]
    for i, row in enumerate(rows):
        for token in range(logits.shape[1]):
            word = token // 32
            allowed = word < num_words and (int(bitmask[i, word]) >> (token % 32)) & 1
            if not allowed:
                out[row, token] = float("-inf")
    return out


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(1, 6),
    vocab=st.integers(1, 200),
    extra_words=st.integers(-2, 2),
    data=st.data(),
)
def test_torch_path_matches_the_loop(num_rows: int, vocab: int, extra_words: int, data: st.DataObject) -> None:
    num_words = max(1, (vocab + 31) // 32 + extra_words)  # masks narrower or wider than the vocabulary
    rows = data.draw(st.lists(st.integers(0, num_rows - 1), min_size=0, max_size=num_rows, unique=True))
    seed = data.draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31, (len(rows), num_words), generator=gen, dtype=torch.int64).to(torch.int32)
    expected = loop_reference(logits, bitmask, rows)
    apply_token_bitmask_(logits, TokenBitmask(bitmask, torch.tensor(rows, dtype=torch.int64)))
    torch.testing.assert_close(logits, expected)


def test_masking_never_changes_an_allowed_argmax() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 100, generator=gen)
    best = logits.argmax(dim=-1)
    bitmask = torch.zeros(4, 4, dtype=torch.int32)
    for i, token in enumerate(best.tolist()):  # allow the argmax and a few others
        for t in (token, (token + 7) % 100, (token + 31) % 100):
            bitmask[i, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    masked = logits.clone()
    apply_token_bitmask_(masked, TokenBitmask(bitmask, torch.arange(4)))
    assert torch.equal(masked.argmax(dim=-1), best)
    assert int(torch.isfinite(masked).sum()) == 12


def test_unpack_sets_one_bool_per_token() -> None:
    bitmask = torch.tensor([[0b101, -1]], dtype=torch.int32)  # tokens 0 and 2, then all of word 1
    allowed = unpack_bitmask(bitmask, 70)
    assert allowed.shape == (1, 70)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, *range(32, 64)]


def test_an_empty_mask_set_changes_nothing() -> None:
    logits = torch.randn(2, 10)
    before = logits.clone()
    apply_token_bitmask_(logits, TokenBitmask(torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int64)))
    assert torch.equal(logits, before)


@pytest.mark.gpu
def test_triton_kernel_on_cuda_matches_the_loop() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sluice.engines.llm.structured.triton_bitmask import apply_token_bitmask_triton

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(8, 49_155, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31, (3, 1537), generator=gen, dtype=torch.int64).to(torch.int32)
    rows = [6, 0, 3]
    expected = loop_reference(logits, bitmask, rows)
    got = logits.cuda()
    apply_token_bitmask_triton(got, bitmask.cuda(), torch.tensor(rows).cuda())
    torch.testing.assert_close(got.cpu(), expected)
