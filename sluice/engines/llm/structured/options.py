"""``engine.structured_output`` of an ``llm`` pipeline, per-record constraints, and checking the answers.

```yaml
engine:
  type: llm
  structured_output:
    json_schema: {type: object, properties: {...}, required: [...]}    # or one of:
    # json_schema_file: schemas/review.json    (relative to the pipeline file)
    # choice: [positive, negative, neutral]
    # regex: "[A-Z]{2}-[0-9]{4}"
    # grammar: "start: ..."                    (Lark, for llguidance)
    backend: llguidance                          # or xgrammar
  overrides: {json_schema: schema}               # a record's own `schema` field replaces it (or choice, regex)
```

Everything a user can get wrong here is found by ``sluice validate``, with the YAML path: not exactly one
kind, a schema that is not a JSON Schema or uses what the backend cannot enforce, a regex that does not
compile, an unreadable schema file. A per-record constraint that is wrong is that record's error (it is
dead-lettered with the reason), never the pipeline's.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from sluice.engines.llm.structured.backend import GrammarError, backend_class
from sluice.engines.llm.structured.spec import StructuredOutput

log = logging.getLogger(__name__)

OVERRIDE_KINDS = ("json_schema", "choice", "regex")  # constraints a record may carry in a field of its own


class StructuredOutputOptions(BaseModel):
    """Everything under ``engine.structured_output``: exactly one constraint, and the backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    backend: Literal["llguidance", "xgrammar"] = "llguidance"
    """The grammar library: `llguidance` or `xgrammar`."""
    json_schema: dict[str, Any] | None = None
    """Answers follow this JSON Schema (inline)."""
    json_schema_file: str | None = None  # resolved against the pipeline file's directory
    """Answers follow the JSON Schema in this file (relative to the pipeline file)."""
    choice: list[str] | None = None
    """The answer is exactly one of these strings."""
    regex: str | None = None
    """The answer matches this regular expression."""
    grammar: str | None = None
    """The answer follows this grammar (Lark syntax for llguidance, EBNF for xgrammar)."""

    @field_validator("json_schema", "choice", "regex", "grammar")
    @classmethod
    def _valid_constraint(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            check(_spec(str(info.field_name), value), info.data.get("backend", "llguidance"))
        return value

    @field_validator("json_schema_file")
    @classmethod
    def _valid_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base = (info.context or {}).get("base_dir")
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = Path(base or ".") / path
        check(StructuredOutput(json_schema=read_schema_file(path)), info.data.get("backend", "llguidance"))
        return str(path.resolve())

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputOptions:
        given = [k for k in ("json_schema", "json_schema_file", "choice", "regex", "grammar") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("set exactly one of json_schema, json_schema_file, choice, regex or grammar "
                             f"(got {', '.join(given) or 'none'})")
        return self

    @property
    def has_schema(self) -> bool:
        return self.json_schema is not None or self.json_schema_file is not None

    def spec(self) -> StructuredOutput:
        """The constraint (a schema file is read again: ValueError if it changed into something unusable)."""
        if self.json_schema_file is not None:
            return StructuredOutput(json_schema=read_schema_file(Path(self.json_schema_file)))
        return StructuredOutput(json_schema=self.json_schema, choice=self.choice, regex=self.regex,
                                grammar=self.grammar)


def read_schema_file(path: Path) -> Any:
    """The JSON document in ``path``; ValueError saying what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read the schema file {str(path)!r}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the schema file {str(path)!r} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise ValueError(f"the schema file {str(path)!r} is not valid JSON: {err}") from None


def check(spec: StructuredOutput, backend: str) -> None:
    """ValueError, with a message a user can act on, if ``spec`` cannot constrain an answer."""
    schema = spec.schema()
    if isinstance(schema, dict):
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as err:
            where = "/".join(str(p) for p in err.absolute_path)
            raise ValueError(f"not a valid JSON Schema{f' at {where}' if where else ''}: {err.message}") from None
    try:
        warnings = backend_class(backend).check(spec)
    except GrammarError as err:
        raise ValueError(f"{backend} cannot enforce this {spec.kind}: {err}") from None
    for warning in warnings:
        log.warning("structured output: %s will not enforce all of this %s while generating (%s); answers "
                    "are still validated against the whole schema", backend, spec.kind, warning)


def record_spec(kind: str, value: Any, backend: str, checked: OrderedDict[str, None]) -> StructuredOutput:
    """The constraint a record carries in a field (``overrides``); ValueError if it is unusable.

    ``checked`` remembers recently checked constraints (most recent last), so records that share one are
    checked once.
    """
    spec = _spec(kind, value)
    if spec.key not in checked:
        check(spec, backend)
        checked[spec.key] = None
        while len(checked) > 256:
            checked.popitem(last=False)
    checked.move_to_end(spec.key)
    return spec


class AnswerChecker:
    """Validates JSON answers against their schema, one compiled ``jsonschema`` validator per schema."""

    def __init__(self, max_cached: int = 256) -> None:
        self._validators: OrderedDict[str, Any] = OrderedDict()
        self._max_cached = max_cached

    def problem(self, answer: Any, spec: StructuredOutput) -> str | None:
        """Why ``answer`` does not validate against ``spec``'s schema, or None (also for other kinds)."""
        if spec.kind != "json_schema":
            return None
        validator = self._validators.get(spec.key)
        if validator is None:
            import jsonschema

            validator = self._validators[spec.key] = jsonschema.Draft202012Validator(spec.schema())
            while len(self._validators) > self._max_cached:
                self._validators.popitem(last=False)
        error = next(iter(validator.iter_errors(answer)), None)
        return None if error is None else str(error.message)


def _spec(kind: str, value: Any) -> StructuredOutput:
    if kind not in ("json_schema", "choice", "regex", "grammar"):
        raise ValueError(f"unknown constraint kind {kind!r}")
    if kind == "choice" and isinstance(value, list):
        value = tuple(value)
    return StructuredOutput(**{kind: value})
