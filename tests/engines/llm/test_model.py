"""Model building blocks: the CPU paged-attention path, GGUF Q/K layout, and the GGUF tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernels import reference
from sluice.engines.llm.loading.weights import unpermute_rotary_rows
from sluice.engines.llm.model.attention import (
    AttentionMetadata,
    AttentionParams,
    plan_cpu_attention,
    store_and_attend,
)

# (new tokens, KV length after the step): decodes, a whole prompt, prompt chunks over cached context,
# and short multi-token queries (speculative verifies: batched together, padded to the longest)
CASES = [(1, 1), (1, 37), (5, 5), (7, 40), (1, 16), (16, 16), (3, 19), (2, 2), (8, 30), (9, 33)]


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (6, None), (None, 2.0), (11, 30.0)],
                         ids=["causal", "window6", "softcap2", "window11-softcap30"])  # fmt: skip
@pytest.mark.parametrize("planned_group", [3, 1], ids=["planned-for-the-model", "planned-for-another-group"])
def test_cpu_paged_attention_matches_the_reference(planned_group: int, window: int | None,
                                                   softcap: float | None) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 6, 2, 8, 4, 64
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)  # stale values
    free = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, out-of-order block ids
    tables, slots, query_lens, seq_lens = [], [], [], []
    for q_len, kv_len in CASES:
        blocks = [free.pop() for _ in range(-(-kv_len // block_size))]
        tables.append(blocks)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(kv_len - q_len, kv_len)]
        query_lens.append(q_len)
        seq_lens.append(kv_len)
        # Context positions (before this step's tokens) already hold their K/V in both caches.
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor([0, *np.cumsum(query_lens).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seq_len=max(seq_lens),
        cpu_plan=plan_cpu_attention(query_lens, seq_lens, tables, block_size, planned_group,
                                    windows=(window, 3) if window else (), native=native_cpu.usable()),
    )
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reference.store_kv(k, v, ref_k, ref_v, meta.slot_mapping)
    expected = reference.paged_attention(
        q, ref_k, ref_v, meta.block_tables, meta.query_start_loc, meta.seq_lens, head_dim**-0.5,
        sliding_window=window, softcap=softcap,
    )  # fmt: skip
    got = store_and_attend(q, k, v, k_cache, v_cache, meta, AttentionParams(head_dim**-0.5, window, softcap))
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_unpermute_undoes_the_llama_cpp_qk_permutation() -> None:
    num_heads, head_dim, hidden = 3, 8, 5
    hf = np.arange(num_heads * head_dim * hidden, dtype=np.float32).reshape(num_heads * head_dim, hidden)
    # llama.cpp's converter: per head, interleave the two rotary halves (rows 0, d/2, 1, d/2+1, ...).
    gguf = hf.reshape(num_heads, 2, head_dim // 2, hidden).swapaxes(1, 2).reshape(hf.shape)
    assert not np.array_equal(gguf, hf)
    assert gguf[1].tolist() == hf[head_dim // 2].tolist()
    np.testing.assert_array_equal(unpermute_rotary_rows(gguf, num_heads), hf)


TEXTS = [
    "Hello world, how are you?",
    "Label this review: The battery died after 3 days!!",
    "  spaces\n\nnewlines\ttabs and 12345 digits",
    "naïve café — 日本語 émoji 🎉",
    "<|im_start|>user\nhi<|im_end|>\n",
]


def test_gguf_tokenizer_and_chat_template_match_hf(smollm2_gguf: Path) -> None:
    from transformers import AutoTokenizer

    from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer, IncrementalDetokenizer

    ours = ChatTokenizer.from_path(smollm2_gguf)
    hf = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
    assert ours.encode("<|im_start|>") == [hf.convert_tokens_to_ids("<|im_start|>")]
    for messages in (
        [{"role": "user", "content": "Great phone"}],
        [{"role": "system", "content": "You label reviews."}, {"role": "user", "content": "Bad lamp"}],
    ):
        assert ours.apply_chat_template(messages) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    text = TEXTS[3]
    detok = IncrementalDetokenizer(ours)
    deltas = [detok.add(t) for t in ours.encode(text)]
    assert "".join(deltas) == text and "\ufffd" not in "".join(deltas)


def test_unknown_option_and_bad_values_are_errors() -> None:
    from sluice.engines.llm import EngineConfig

    with pytest.raises(TypeError):
        EngineConfig(max_num_seq=4)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="dtype must be"):
        EngineConfig(dtype="fp8")
