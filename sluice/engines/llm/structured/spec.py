"""What a request's answer must look like: a JSON Schema, a regular expression, a choice of strings or a grammar.

A :class:`StructuredOutput` is plain, immutable data. It is checked for *shape* on construction (exactly one
kind, the right types; ValueError naming the field); whether the schema or regex itself is valid is the
grammar backend's to say (:meth:`~sluice.engines.llm.structured.backend.GrammarBackend.check`), since only
it knows which JSON Schema keywords and regex features it supports.

Pure Python: never imports torch or a grammar library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

GrammarKind = Literal["json_schema", "regex", "choice", "grammar"]
KINDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Constrain a request's answer; set exactly one of the four fields.

    * ``json_schema``: a JSON Schema (a mapping, or its JSON text). The answer is one JSON value valid
      against it.
    * ``regex``: the whole answer matches this regular expression (Rust ``regex`` syntax: no look-around,
      no back-references).
    * ``choice``: the answer is exactly one of these strings.
    * ``grammar``: a context-free grammar in the backend's syntax (Lark for llguidance).
    """

    json_schema: dict[str, Any] | bool | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    # Canonical text of the one field set: equal constraints share a compiled grammar (see ``key``).
    _text: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [name for name in KINDS if getattr(self, name) is not None]
        if len(given) != 1:
            what = ", ".join(given) if given else "none"
            raise ValueError(f"structured output needs exactly one of json_schema, regex, choice or grammar "
                             f"(got {what})")
        text = _canonical(given[0], getattr(self, given[0]))
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        object.__setattr__(self, "_text", text)

    @property
    def kind(self) -> GrammarKind:
        for name in KINDS:
            if getattr(self, name) is not None:
                return name
        raise AssertionError("unreachable: __post_init__ requires one kind")

    @property
    def text(self) -> str:
        """The constraint as text: compact JSON for a schema (key order kept) or a choice list, else as given."""
        return self._text

    @property
    def key(self) -> str:
        """Cache key: equal for constraints that compile to the same grammar."""
        return f"{self.kind}:{self._text}"

    def schema(self) -> dict[str, Any] | bool | None:
        """The JSON Schema as an object (parsed when given as text); None for other kinds."""
        if self.json_schema is None:
            return None
        parsed: dict[str, Any] | bool = json.loads(self._text)
        return parsed


def _canonical(kind: str, value: Any) -> str:
    if kind == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as err:
                raise ValueError(f"json_schema is not valid JSON text: {err}") from None
        if not isinstance(value, (dict, bool)):
            raise ValueError(f"json_schema must be a mapping (or true/false), got {type(value).__name__}")
        try:
            # Key order kept: grammar backends generate an object's properties in the schema's order.
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"json_schema must hold only JSON values: {err}") from None
    if kind == "choice":
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError(f"choice must be a list of strings, got {type(value).__name__}")
        if not value:
            raise ValueError("choice must list at least one string")
        for item in value:
            if not isinstance(item, str) or not item:
                raise ValueError(f"choice entries must be non-empty strings, got {item!r}")
        if len(set(value)) != len(value):
            raise ValueError(f"choice lists a string twice: {sorted(v for v in set(value) if value.count(v) > 1)}")
        return json.dumps(list(value), ensure_ascii=False)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    return str(value)
