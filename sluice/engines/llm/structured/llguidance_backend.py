"""The llguidance grammar backend (Microsoft's Rust grammar engine behind ``pip install llguidance``).

Why llguidance: it computes a token mask lazily from the lexer state (no ahead-of-time compilation pass
per grammar: a JSON-schema grammar builds quickly), fills masks for a batch on its own threads without the
GIL, validates draft tokens and rolls back, and reads a HF ``tokenizers`` JSON directly. A compiled grammar
here is a matcher at the start state; each request gets a deep copy of it (microseconds).

JSON answers: whitespace between JSON tokens is allowed but bounded (``_JSON_WHITESPACE``), so a small
model cannot loop on newlines until ``max_tokens``; a schema's own ``x-guidance`` options override this.
Keywords llguidance does not implement (``uniqueItems``, say) are not enforced, and reported as warnings
by :meth:`LLGuidanceBackend.check` and at compile time (the ``llm`` pipeline still validates every answer
against the whole schema).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llguidance

from sluice.engines.llm.structured.backend import BitmaskRow, GrammarError, TokenTable
from sluice.engines.llm.structured.spec import StructuredOutput

if TYPE_CHECKING:
    import torch  # imported where masks are filled: checking a pipeline's constraint needs no torch

log = logging.getLogger(__name__)

# At most 12 whitespace characters at each point a JSON text allows them: enough for a newline and a few
# levels of indentation, too few for a runaway.
_JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,12}"


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar (its JSON form) for ``spec``; raises GrammarError for malformed input."""
    try:
        if spec.kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(
                spec.text, defaults={"whitespace_pattern": _JSON_WHITESPACE, "lenient": True}))
        if spec.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(spec.text))
        if spec.kind == "choice":
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice or ())
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
        return str(llguidance.LLMatcher.grammar_from_lark(spec.text))
    except ValueError as err:
        raise GrammarError(str(err)) from None


class LLGuidanceBackend:
    """:class:`~sluice.engines.llm.structured.backend.GrammarBackend` on llguidance."""

    name = "llguidance"

    def __init__(self, table: TokenTable, num_threads: int | None = None) -> None:
        self.tokenizer = _ll_tokenizer(table)
        if self.tokenizer.vocab_size < table.vocab_size:
            raise ValueError(f"llguidance sees {self.tokenizer.vocab_size} tokens, the model {table.vocab_size}")
        self.bitmask_words = (self.tokenizer.vocab_size + 31) // 32
        # Mask filling for the batch runs on these threads, outside the GIL.
        self._executor = llguidance.LLExecutor(num_threads)

    @staticmethod
    def check(spec: StructuredOutput) -> list[str]:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(spec))
        if is_error:
            raise GrammarError(_clean(messages[0] if messages else "invalid grammar"))
        return [_clean(m) for m in messages]

    def compile(self, spec: StructuredOutput) -> Any:
        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(_clean(matcher.get_error()))
        for warning in matcher.get_grammar_warnings():
            log.warning("structured output: %s is not enforced while generating (%s)", spec.kind, _clean(warning))
        return matcher

    def matcher(self, compiled: Any) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy())

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: torch.Tensor) -> None:
        import torch

        if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or not bitmask.is_contiguous():
            raise ValueError("the bitmask must be a contiguous int32 CPU tensor")
        if bitmask.shape[1] != self.bitmask_words:
            raise ValueError(f"bitmask rows have {bitmask.shape[1]} words; this grammar needs {self.bitmask_words}")
        plain: list[tuple[Any, int]] = []
        drafted: list[tuple[Any, int, list[int]]] = []
        for matcher, row, drafts in rows:
            if not isinstance(matcher, LLGuidanceMatcher):
                raise TypeError(f"not an llguidance matcher: {type(matcher).__name__}")
            if drafts:
                drafted.append((matcher.inner, row, list(drafts)))
            else:
                plain.append((matcher.inner, row))
        ptr, row_bytes, num_rows = bitmask.data_ptr(), self.bitmask_words * 4, bitmask.shape[0]
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, ptr, row_bytes, num_rows)
        if drafted:  # llguidance wants at least one draft per entry here
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafted, ptr, row_bytes, num_rows)


class LLGuidanceMatcher:
    """:class:`~sluice.engines.llm.structured.backend.GrammarMatcher` on an ``llguidance.LLMatcher``."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def accept(self, token_ids: Sequence[int]) -> bool:
        return bool(self.inner.consume_tokens(list(token_ids)))

    def validate(self, token_ids: Sequence[int]) -> int:
        return int(self.inner.validate_tokens(list(token_ids))) if token_ids else 0

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self.inner.rollback(num_tokens):
            raise RuntimeError(f"llguidance could not roll back {num_tokens} tokens: {self.inner.get_error()}")

    def forced_tokens(self) -> list[int]:
        return list(self.inner.compute_ff_tokens())

    def is_terminated(self) -> bool:
        return bool(self.inner.is_stopped()) and not self.inner.is_error()

    def error(self) -> str | None:
        return _clean(self.inner.get_error()) if self.inner.is_error() else None


def _ll_tokenizer(table: TokenTable) -> Any:
    """llguidance's tokenizer for ``table``: from the tokenizer JSON when llguidance reads that decoder,
    else from the token bytes. A model without an EOS token gets a virtual one past the LM head's rows
    (no logit can ever pick it), so a complete grammar still reads as terminated."""
    eos = list(table.eos_token_ids) or [table.vocab_size]
    n_vocab = table.vocab_size + (0 if table.eos_token_ids else 1)
    if table.tokenizer_json is not None:
        try:
            return llguidance.LLTokenizer(table.tokenizer_json, n_vocab=n_vocab, eos_token=eos)
        except ValueError:
            pass  # a decoder llguidance does not know (one character per token, say): use the bytes
    tokens = list(table.token_bytes)
    special = set(table.special_token_ids)
    if not table.eos_token_ids:
        tokens.append(b"<|sluice_virtual_eos|>")
        special.add(table.vocab_size)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenSource(tokens, special, eos[0], table)),
                                  eos_token=eos)


class _TokenSource:
    """The duck-typed tokenizer ``llguidance.TokenizerWrapper`` reads (tokens, special ids, EOS, encode)."""

    def __init__(self, tokens: list[bytes], special: set[int], eos: int, table: TokenTable) -> None:
        self.tokens = tokens
        self.special_token_ids = sorted(special)
        self.eos_token_id = eos
        self.bos_token_id = None
        self._encode = table.encode

    def __call__(self, text: str | bytes) -> list[int]:
        return self._encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)


def _clean(message: str) -> str:
    """llguidance errors can carry a grammar dump after the first lines; keep what a user can act on."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return " ".join(line.strip() for line in lines[:6])[:600] or "invalid grammar"
