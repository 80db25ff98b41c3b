"""Fixtures for the structured-output tests: token tables of the tiny test tokenizer and of SmolLM2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer
from sluice.engines.llm.structured.backend import TokenTable
from sluice.engines.llm.structured.token_table import token_table


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: Path) -> ChatTokenizer:
    """SmolLM2's tokenizer as Sluice builds it from the GGUF metadata (the file has no tokenizer.json)."""
    return ChatTokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_table(smollm2_tokenizer: ChatTokenizer) -> TokenTable:
    return token_table(smollm2_tokenizer.tokenizer, 49152, (2,))


@pytest.fixture(scope="session")
def tiny_table(tiny_llama_dir: Callable[[bool], Path]) -> TokenTable:
    """One printable character per token, 256 tokens, no EOS (the tiny random Llama's tokenizer)."""
    return token_table(ChatTokenizer.from_path(tiny_llama_dir(False)).tokenizer, 256, ())
