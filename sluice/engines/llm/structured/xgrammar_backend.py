"""The xgrammar grammar backend (``pip install xgrammar``), pluggable in place of llguidance.

xgrammar compiles a grammar ahead of time against the whole vocabulary (an adaptive token-mask cache), so a
compile costs more than llguidance's but each mask is mostly a cache lookup. It reads the same token table
(raw bytes per id; special tokens are given as empty byte strings, which xgrammar never allows as text).
``grammar`` is Lark syntax, as for llguidance. A model without an EOS token gets a virtual stop token past
the LM head's rows, so a complete grammar still reads as terminated.

Draft masks: the matcher accepts each draft, fills the next row, then rolls all of them back (xgrammar
keeps an unlimited rollback history).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar

from sluice.engines.llm.structured.backend import BitmaskRow, GrammarError, TokenTable
from sluice.engines.llm.structured.bitmask import unpack_bitmask
from sluice.engines.llm.structured.spec import StructuredOutput

_MAX_JSON_WHITESPACE = 12  # as for llguidance: bounded whitespace, so small models cannot loop on it


def _lark(spec: StructuredOutput) -> str:
    if spec.kind == "choice":
        return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice or ())
    return spec.text


def _errors(err: Exception) -> GrammarError:
    """xgrammar's messages start with a source location; keep the part a user can act on."""
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(err).strip())
    return GrammarError(text.splitlines()[0] if text else type(err).__name__)


class XGrammarBackend:
    """:class:`~sluice.engines.llm.structured.backend.GrammarBackend` on xgrammar."""

    name = "xgrammar"

    def __init__(self, table: TokenTable, num_threads: int = 2) -> None:
        vocab = [b"" if i in table.special_token_ids else tok for i, tok in enumerate(table.token_bytes)]
        stop = list(table.eos_token_ids)
        if not stop:
            vocab.append(b"")
            stop = [table.vocab_size]
        self.info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=stop)
        self.bitmask_words = (len(vocab) + 31) // 32
        self._stop = frozenset(stop)
        self._compiler = xgrammar.GrammarCompiler(self.info, max_threads=num_threads)
        self._batch = xgrammar.BatchGrammarMatcher(num_threads)

    @staticmethod
    def check(spec: StructuredOutput) -> list[str]:
        try:
            if spec.kind == "json_schema":
                xgrammar.Grammar.from_json_schema(spec.text, max_whitespace_cnt=_MAX_JSON_WHITESPACE)
            elif spec.kind == "regex":
                xgrammar.Grammar.from_regex(spec.text)
            else:
                xgrammar.Grammar.from_lark(_lark(spec))
        except RuntimeError as err:
            raise _errors(err) from None
        return []

    def compile(self, spec: StructuredOutput) -> Any:
        try:
            if spec.kind == "json_schema":
                return self._compiler.compile_json_schema(spec.text, max_whitespace_cnt=_MAX_JSON_WHITESPACE)
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.text)
            return self._compiler.compile_lark(_lark(spec))
        except RuntimeError as err:
            raise _errors(err) from None

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        inner = xgrammar.GrammarMatcher(compiled)
        return XGrammarMatcher(inner, self)

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: torch.Tensor) -> None:
        if bitmask.shape[1] != self.bitmask_words:
            raise ValueError(f"bitmask rows have {bitmask.shape[1]} words; this grammar needs {self.bitmask_words}")
        matchers: list[Any] = []
        indices: list[int] = []
        drafted: list[tuple[Any, int, Sequence[int]]] = []
        for matcher, row, drafts in rows:
            if not isinstance(matcher, XGrammarMatcher):
                raise TypeError(f"not an xgrammar matcher: {type(matcher).__name__}")
            if drafts:
                drafted.append((matcher.inner, row, drafts))
            else:
                matchers.append(matcher.inner)
                indices.append(row)
        if matchers:
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices)
        for inner, row, drafts in drafted:  # one row per draft position, then back to where it was
            inner.fill_next_token_bitmask(bitmask, row)
            for j, token in enumerate(drafts):
                if not inner.accept_token(token):
                    raise ValueError(f"draft token {token} is not allowed by the grammar (drafts are validated first)")
                inner.fill_next_token_bitmask(bitmask, row + j + 1)
            inner.rollback(len(drafts))

    def only_stop_allowed(self, inner: Any) -> bool:
        """True when the next mask allows nothing but stop tokens (the grammar cannot go on)."""
        bitmask = torch.zeros(1, self.bitmask_words, dtype=torch.int32)
        inner.fill_next_token_bitmask(bitmask, 0)
        allowed = unpack_bitmask(bitmask, 32 * self.bitmask_words)[0]
        allowed[list(self._stop)] = False
        return not bool(allowed.any())


class XGrammarMatcher:
    """:class:`~sluice.engines.llm.structured.backend.GrammarMatcher` on an ``xgrammar.GrammarMatcher``."""

    __slots__ = ("_backend", "_error", "inner")

    def __init__(self, inner: Any, backend: XGrammarBackend) -> None:
        self.inner = inner
        self._backend = backend
        self._error: str | None = None

    def accept(self, token_ids: Sequence[int]) -> bool:
        if self._error is not None:
            return False
        for token in token_ids:
            if not self.inner.accept_token(token):
                self._error = f"token {token} is not allowed here"
                return False
        return True

    def validate(self, token_ids: Sequence[int]) -> int:
        num = 0
        for token in token_ids:
            if not self.inner.accept_token(token):
                break
            num += 1
        if num:
            self.inner.rollback(num)
        return num

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback(num_tokens)

    def forced_tokens(self) -> list[int]:
        return list(self.inner.find_jump_forward_tokens())

    def is_terminated(self) -> bool:
        if self._error is not None:
            return False
        return bool(self.inner.is_terminated()) or (
            bool(self.inner.is_completed()) and self._backend.only_stop_allowed(self.inner)
        )

    def error(self) -> str | None:
        return self._error
