"""The contract between the engine and a grammar library (llguidance, xgrammar), and how to pick one.

A backend turns a :class:`~sluice.engines.llm.structured.spec.StructuredOutput` into a compiled grammar,
hands out one :class:`GrammarMatcher` per request, and fills token bitmasks for a whole batch at once. Who
calls what, and from which thread::

    GrammarBackend.check(spec)             # any thread, no model needed (``sluice validate``); GrammarError
    backend = factory(token_table)         # compile thread: building the token trie can take a second
    compiled = backend.compile(spec)       # compile thread; may block; GrammarError for a bad constraint
    matcher = backend.matcher(compiled)    # engine thread; cheap
    backend.fill_bitmask(rows, bitmask)    # engine thread, once per step for every constrained row
    matcher.accept(tokens) ...             # engine thread, after each step

Bitmask layout (shared with llguidance and xgrammar): int32 ``(num_rows, ceil(vocab_size / 32))``; bit
``t % 32`` of word ``t // 32`` set means token ``t`` is allowed. ``vocab_size`` is the LM head's row count,
which may exceed the tokenizer's; ids the tokenizer lacks are never allowed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sluice.engines.llm.structured.spec import StructuredOutput

if TYPE_CHECKING:
    import torch


class GrammarError(ValueError):
    """A constraint that cannot be compiled: an invalid schema or regex, or a feature the backend lacks.

    The message is one paragraph a user can act on (it names what is wrong, not where in Sluice).
    """


@dataclass(frozen=True, slots=True)
class TokenTable:
    """What a grammar backend must know about the model's tokens, independent of where they came from."""

    vocab_size: int  # LM head rows: the width of every bitmask (>= len(token_bytes))
    token_bytes: list[bytes]  # the UTF-8 bytes each token id stands for (special tokens: their text)
    special_token_ids: frozenset[int]  # control tokens (<|im_start|>, EOS...): never produced by text
    eos_token_ids: tuple[int, ...]  # tokens that end a request; allowed once the grammar is complete
    encode: Callable[[str], list[int]]  # the model's own tokenisation of text (no special tokens added)
    tokenizer_json: str | None = None  # the HF ``tokenizers`` JSON, for backends that load it themselves


class GrammarMatcher(Protocol):
    """One request's position in its grammar. Engine thread only; never raises for a bad token."""

    def accept(self, token_ids: Sequence[int]) -> bool:
        """Advance over ``token_ids``; False (and :meth:`error` says why) if one is not allowed."""
        ...

    def validate(self, token_ids: Sequence[int]) -> int:
        """How many leading ``token_ids`` the grammar allows from here; the state does not change."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        ...

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (the only continuation there is), possibly none."""
        ...

    def is_terminated(self) -> bool:
        """True when the grammar is complete and nothing but an end-of-sequence token may follow."""
        ...

    def error(self) -> str | None:
        """Why the matcher failed (it then stays failed), or None."""
        ...


# (matcher, first bitmask row, drafts): rows first_row .. first_row + len(drafts) get the masks after
# consuming drafts[:0], drafts[:1], ... drafts[:len(drafts)]; the matcher's state is unchanged afterwards.
# The drafts must be ones the grammar allows (``GrammarMatcher.validate``): the Drafter checks them.
BitmaskRow = tuple[GrammarMatcher, int, Sequence[int]]


class GrammarBackend(Protocol):
    """A grammar library behind Sluice's contract (see the module docstring for the threads)."""

    name: str
    bitmask_words: int  # int32 words per bitmask row: ceil(vocab / 32) of the backend's vocabulary

    @staticmethod
    def check(spec: StructuredOutput) -> list[str]:
        """Raise :class:`GrammarError` if ``spec`` cannot compile (no tokenizer needed); else return
        warnings: parts of it the backend will not enforce (unimplemented JSON Schema keywords, say)."""
        ...

    def compile(self, spec: StructuredOutput) -> Any:
        """A compiled grammar for ``spec``, shared by every request with the same ``spec.key``."""
        ...

    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of ``compiled``."""
        ...

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: torch.Tensor) -> None:
        """Write the masks of every row of ``rows`` into ``bitmask`` (CPU, int32, contiguous) in one call."""
        ...


BackendFactory = Callable[[TokenTable], GrammarBackend]

# backend name -> "module:class"; imported only when a pipeline or a caller names it
BACKENDS: dict[str, str] = {
    "llguidance": "sluice.engines.llm.structured.llguidance_backend:LLGuidanceBackend",
    "xgrammar": "sluice.engines.llm.structured.xgrammar_backend:XGrammarBackend",
}


def backend_class(name: str) -> Any:
    """The backend class called ``name``. ValueError for an unknown name, or one whose library is missing."""
    if name not in BACKENDS:
        raise ValueError(f"unknown structured-output backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name = BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"structured-output backend {name!r} needs the {name} package ({err}); "
                         f"install it with: pip install {name}") from None
    return getattr(module, class_name)
