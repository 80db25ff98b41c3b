"""Sluice's tokenizers and chat templates against HF ``AutoTokenizer`` / ``apply_chat_template``.

Four vocabularies, each loaded from its HF directory and from the GGUF llama.cpp's converter writes of it:
Llama 3.2's and Qwen3's real byte-level BPE tokenizers (GGUF split rules ``llama-bpe`` and ``qwen2``), and
two SentencePiece BPE tokenizers trained here the way Gemma's (no dummy prefix) and Phi-3's (a leading
``▁``) are. On a varied text set (accents, CJK, emoji, whitespace runs, digits, contractions, inline special
tokens) token ids and decoded text must equal HF's, and rendered chat prompts and their ids must equal
``apply_chat_template``'s.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer
from sluice.engines.llm.loading.gguf_file import GGUFFile
from tests.support.llama_cpp import convert_many
from tests.support.real_tokenizers import tokenizer_files
from tests.support.texts import varied_texts
from tests.support.tiny_llms import LLAMA3_TEMPLATE

TEXTS = varied_texts(80, seed=5) + [
    "Hello world, how are you?",
    "  leading, trailing  ",
    "a    b\t\tc\n\n\nd \n e",
    "1234567 + 89 = 1234656; 3.14159",
    "don't I'M you'll THEY'RE we've",
    "def f(x):\n    return x ** 2  # square\n",
    "naïve café — 日本語 한국어 العربية עברית ελληνικά 🎉👍🏽👨‍👩‍👧",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|user|>\nLabel: great phone<|end|>",
]
CHATS = [
    [{"role": "user", "content": "Label this review: the battery died after 3 days!!"}],
    [{"role": "system", "content": "You label reviews as positive or negative."},
     {"role": "user", "content": "  Great phone, très bien 👍  "}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Extract the city: shipping to Berlin by Monday."}],
]  # fmt: skip
SOURCES = [f"{name}-{kind}" for name in ("llama3", "qwen3", "gemma", "phi3") for kind in ("hf", "gguf")]


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_family_dir: Callable[..., Path],
                   tiny_family_gguf: Callable[[str], Path]) -> dict[str, Path]:  # fmt: skip
    """source name -> HF directory or GGUF file (the real BPE vocabularies converted vocab-only)."""
    root = tmp_path_factory.mktemp("tokenizers")
    configs = {
        "llama3": dict(model_type="llama", architectures=["LlamaForCausalLM"], num_attention_heads=4),
        "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], num_attention_heads=4, head_dim=16),
    }
    sources: dict[str, Path] = {}
    jobs = []
    for name, config in configs.items():
        path = root / name
        shutil.copytree(tokenizer_files(name), path)
        if name == "llama3":  # the package ships no chat template: one in the shape of Llama 3's
            (path / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)
        tokens = json.loads((path / "tokenizer.json").read_text())
        vocab = max([*tokens["model"]["vocab"].values(), *(t["id"] for t in tokens["added_tokens"])]) + 1
        (path / "config.json").write_text(json.dumps(dict(config, vocab_size=vocab, hidden_size=64,
                                                          intermediate_size=128, num_hidden_layers=1)))  # fmt: skip
        sources[f"{name}-hf"], sources[f"{name}-gguf"] = path, root / f"{name}.gguf"
        jobs.append((path, root / f"{name}.gguf", True))
    convert_many(jobs)
    for name, family in (("gemma", "gemma2"), ("phi3", "phi3")):
        sources[f"{name}-hf"], sources[f"{name}-gguf"] = tiny_family_dir(family), tiny_family_gguf(family)
    return sources


@pytest.fixture(scope="session")
def hf_tokenizers(tokenizer_dirs: dict[str, Path]) -> Callable[[str], object]:
    from transformers import AutoTokenizer

    loaded: dict[str, object] = {}

    def get(source: str) -> object:
        name = source.rsplit("-", 1)[0]
        if name not in loaded:
            loaded[name] = AutoTokenizer.from_pretrained(tokenizer_dirs[f"{name}-hf"])
        return loaded[name]

    return get


@pytest.mark.parametrize("source", SOURCES)
def test_token_ids_and_text_equal_hf(source: str, tokenizer_dirs: dict[str, Path],
                                     hf_tokenizers: Callable[[str], object]) -> None:  # fmt: skip
    ours = ChatTokenizer.from_path(tokenizer_dirs[source])
    hf = hf_tokenizers(source)
    for text in TEXTS:
        plain = ours.encode(text, add_special_tokens=False)
        assert plain == hf.encode(text, add_special_tokens=False), text  # type: ignore[attr-defined]
        assert ours.encode(text) == hf(text)["input_ids"], text  # type: ignore[operator]
        expected = hf.decode(plain, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # type: ignore[attr-defined]
        assert ours.decode(plain) == expected, text


@pytest.mark.parametrize("source", SOURCES)
def test_chat_template_renders_and_tokenises_as_hf(source: str, tokenizer_dirs: dict[str, Path],
                                                   hf_tokenizers: Callable[[str], object]) -> None:  # fmt: skip
    ours = ChatTokenizer.from_path(tokenizer_dirs[source])
    hf = hf_tokenizers(source)
    variants: list[dict[str, object]] = [{}]
    if source.startswith("qwen3"):
        variants.append({"enable_thinking": False})
    for messages in CHATS:
        for extra in variants:
            for generation_prompt in (True, False):
                expected = hf.apply_chat_template(  # type: ignore[attr-defined]
                    messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
                )
                prompt = ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, **extra)
                assert prompt == expected
                ids = hf.apply_chat_template(  # type: ignore[attr-defined]
                    messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False, **extra
                )
                assert ours.encode(prompt, add_special_tokens=False) == list(ids)


def test_gguf_tokenizer_settings_are_llama_cpp_s(tokenizer_dirs: dict[str, Path]) -> None:
    """The converter's names for the split rules are the ones this suite exercises (not a silent default)."""
    pre = {name: GGUFFile(tokenizer_dirs[f"{name}-gguf"]).get("tokenizer.ggml.pre") for name in ("llama3", "qwen3")}
    assert pre == {"llama3": "llama-bpe", "qwen3": "qwen2"}
    gemma = GGUFFile(tokenizer_dirs["gemma-gguf"])
    assert gemma.get("tokenizer.ggml.model") == "llama" and gemma.get("tokenizer.ggml.add_space_prefix") is False
