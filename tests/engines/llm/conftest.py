"""Models for the LLM engine tests: tiny random Llamas (built in milliseconds) and the real SmolLM2.

``tiny_llama_dir(tie=...)`` saves a randomly initialised HF ``LlamaForCausalLM`` (3 layers, hidden 64,
GQA 4/2 heads, vocab 256) with a ``tokenizer.json`` of one printable character per token (ASCII first),
so text prompts, detokenisation and stop strings work on it too. ``smollm2_gguf`` fetches SmolLM2-135M into
the model cache once (``$SLUICE_CACHE_DIR``), like the other engine tests' real models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from sluice.engines.llm.attention import AttentionMetadata, plan_cpu_attention
from sluice.engines.llm.model import LlamaModel

TINY_VOCAB = 256


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run these tests on one intra-op thread: on a shared 2-core CI runner, OpenMP threads that wait on
    each other at every small matmul's barrier make the tests many times slower, never faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _save_char_tokenizer(path: Path) -> None:
    """One printable character per token id: printable ASCII first, then Latin Extended letters."""
    from tokenizers import Tokenizer, decoders, models

    chars = [chr(c) for c in range(32, 127)] + [chr(0x100 + i) for i in range(TINY_VOCAB - 95)]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.decoder = decoders.Fuse()  # concatenate: decode(ids) has exactly one character per token
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[bool], Path]:
    """Factory: ``tiny_llama_dir(tie)`` -> directory with config.json, model.safetensors, tokenizer.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    made: dict[bool, Path] = {}

    def make(tie: bool = False) -> Path:
        if tie not in made:
            torch.manual_seed(1234 + tie)
            cfg = LlamaConfig(
                vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rope_theta=10000.0, tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None,
                pad_token_id=None,
            )  # fmt: skip
            model = LlamaForCausalLM(cfg).eval()
            # Larger-than-default weights make the next-token distribution peaked, so greedy choices are
            # not decided by float rounding between near-equal logits.
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() == 2:
                        p.normal_(0.0, 0.15)
            path = tmp_path_factory.mktemp(f"tiny-llama-tie{int(tie)}")
            model.save_pretrained(path)
            _save_char_tokenizer(path)
            made[tie] = path
        return made[tie]

    return make


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF, fetched into the model cache on first use."""
    from sluice.models import fetch

    return next(iter(sorted(Path(fetch("smollm2-135m")).glob("*.gguf"))))


def logprobs_after(model: LlamaModel, tokens: list[int]) -> torch.Tensor:
    """The model's next-token log-probs after ``tokens`` (vocab,), computed in a private KV cache."""
    cfg, n, bs = model.config, len(tokens), 16
    num_blocks = -(-n // bs)
    caches = [
        (torch.zeros(num_blocks, bs, cfg.num_kv_heads, cfg.head_dim),
         torch.zeros(num_blocks, bs, cfg.num_kv_heads, cfg.head_dim))
        for _ in range(cfg.num_layers)
    ]  # fmt: skip
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n), query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32), block_tables=torch.empty(0), max_seq_len=n,
        cpu_plan=plan_cpu_attention([n], [n], [list(range(num_blocks))], bs),
    )  # fmt: skip
    with torch.inference_mode():
        logits = model(torch.tensor(tokens), torch.arange(n), caches, meta, torch.tensor([n - 1]))
    return torch.log_softmax(logits[0], dim=-1)


@pytest.fixture(scope="session")
def next_logprobs() -> Callable[[LlamaModel, list[int]], torch.Tensor]:
    """``next_logprobs(model, tokens)`` -> (vocab,) log-probs of the token after ``tokens``."""
    return logprobs_after
