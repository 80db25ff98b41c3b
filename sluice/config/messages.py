"""What a user reads when a pipeline file is wrong: one line per problem, with its YAML path and line.

Secrets never reach a message: a value under a key that looks like a password, token or private key is shown
as ``<redacted>``, even when it is the wrong value.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from sluice.config.suggest import did_you_mean
from sluice.config.yaml_file import YamlPath

_MAX_PROBLEMS = 20  # problems listed; a file with more is not a pipeline with a few mistakes
_MAX_SHOWN = 80  # characters of a value, key or message shown in an error


class ConfigError(Exception):
    """A pipeline file is not valid. ``str(err)`` is the message to show a user, one problem per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        if len(problems) > _MAX_PROBLEMS:  # the first ones say what is wrong; hundreds would bury them
            problems = [*problems[:_MAX_PROBLEMS], f"... and {len(problems) - _MAX_PROBLEMS} more problems"]
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


# librdkafka keys and Sluice fields whose values are secrets (sasl.password, ssl.key.password, ...)
_SECRET_KEY = re.compile(r"password|secret|token|jaas|credential|private|ssl\.key", re.IGNORECASE)


def describe(err: ValidationError, prefix: YamlPath, lines: dict[YamlPath, int],
             model: type[BaseModel] | None = None) -> list[str]:
    """One line per problem. ``model``: the section validated (for "did you mean" on an unknown key)."""
    problems = []
    for e in err.errors():
        loc: YamlPath = (*prefix, *(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
        kind = e["type"]
        # a secret's value (even a wrong one) never reaches a message
        secret = any(isinstance(p, str) and _SECRET_KEY.search(p) for p in loc)
        shown = "<redacted>" if secret else short(repr(e.get("input")))
        if kind == "extra_forbidden":
            suggestion = did_you_mean(model, loc[len(prefix):])
            msg = (f"unknown key '{short(str(loc[-1]))}'{suggestion}; check the spelling against the configuration "
                   "reference (docs/reference/configuration.md)")
        elif kind == "missing":
            msg = "is required but missing"
        elif kind in ("int_parsing", "int_type", "int_from_float"):
            msg = f"expected an integer, got {shown}"
        elif kind in ("float_parsing", "float_type"):
            msg = f"expected a number, got {shown}"
        elif kind in ("string_type",):
            msg = f"expected a string, got {kind_of(e['input'])}"
        elif kind in ("list_type",):
            msg = f"expected a list, got {kind_of(e['input'])}"
        elif kind in ("model_type", "dict_type", "model_attributes_type"):
            msg = f"expected a mapping, got {kind_of(e['input'])}"
        elif kind == "literal_error":
            msg = f"expected one of {e['ctx']['expected']}, got {shown}"
        else:
            msg = short(e["msg"].removeprefix("Value error, "), 300)
            if "input" in e and not isinstance(e["input"], (dict, list)):
                msg += f" (got {shown})"
        problems.append(f"{where(loc, lines)}: {msg}")
    return problems


def where(loc: YamlPath, lines: dict[YamlPath, int]) -> str:
    dotted = ".".join(f"[{p}]" if isinstance(p, int) else short(p, 40) for p in loc).replace(".[", "[") or "<top>"
    probe = loc
    while probe and probe not in lines:  # a missing key: report the line of its parent mapping
        probe = probe[:-1]
    line = lines.get(probe)
    return f"{dotted} (line {line})" if line else dotted


def short(text: str, max_chars: int = _MAX_SHOWN) -> str:
    """``text`` on one line, cut to ``max_chars``: a message must stay short whatever the file holds."""
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def kind_of(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "boolean", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
