"""Reading a pipeline file: YAML within bounds, ``${VAR}`` / ``${VAR:default}`` from the environment, then
validation section by section, then the engine type's own options.

One call, :func:`load_pipeline`, reads a file and returns a :class:`LoadedPipeline`, or raises
:class:`ConfigError` whose lines name the YAML path, its line in the file, and what was expected -- never a
traceback. Unknown keys are errors everywhere (a misspelt option must not be silently ignored).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sluice.config.applies import check_applicable
from sluice.config.messages import ConfigError, describe, kind_of, short, where
from sluice.config.overrides import OverrideError, apply_overrides
from sluice.config.pipeline import LoadedPipeline, Pipeline
from sluice.config.yaml_file import YamlPath, YamlProblem, load_yaml, read_text
from sluice.engines import engine_types

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")
log = logging.getLogger(__name__)


def load_pipeline(path: str | Path, environ: Mapping[str, str] | None = None,
                  overrides: Sequence[tuple[str, Any]] = ()) -> LoadedPipeline:
    """Read, interpolate and validate a pipeline file. Raises ConfigError with user-facing messages.
    ``overrides``: ``(dotted path, value)`` pairs set over the file's (``--set``, sluice/config/overrides.py)."""
    source = str(path)
    try:
        text = read_text(path)
    except YamlProblem as err:
        raise ConfigError(source, [str(err)]) from None
    return parse_pipeline(text, source=source, environ=os.environ if environ is None else environ,
                          base_dir=Path(path).resolve().parent, overrides=overrides)


def parse_pipeline(text: str, *, source: str = "<pipeline>", environ: Mapping[str, str] | None = None,
                   base_dir: Path | None = None, overrides: Sequence[tuple[str, Any]] = ()) -> LoadedPipeline:
    """Validate pipeline YAML text; see :func:`load_pipeline`. Raises ConfigError, and nothing else: the
    YAML is read within bounds (sluice/config/yaml_file.py), and an error no check foresaw still becomes one
    line (naming it a bug) rather than a traceback."""
    try:
        return _parse(text, source, os.environ if environ is None else environ, base_dir, overrides)
    except ConfigError:
        raise
    except Exception as err:  # a bug in a validator, say: still one line for the user
        log.debug("validating %s failed unexpectedly", source, exc_info=True)
        raise ConfigError(source, [f"cannot validate the file: {type(err).__name__}: {short(str(err))} (a bug "
                                   "in Sluice or an engine: please report it, with the file)"]) from None


def _parse(text: str, source: str, environ: Mapping[str, str], base_dir: Path | None,
           overrides: Sequence[tuple[str, Any]]) -> LoadedPipeline:
    try:
        data, lines = load_yaml(text)
    except YamlProblem as err:
        raise ConfigError(source, [str(err)]) from None
    if data is None:
        raise ConfigError(source, ["the file is empty; expected a mapping with 'source', 'engine' and 'sink'"])
    if not isinstance(data, dict):
        raise ConfigError(source, [f"the top level is a {kind_of(data)}; expected a mapping of sections"])
    # Top-level keys starting with "x-" hold anchors for the rest of the file (`x-kafka: &kafka {...}`, then
    # `<<: *kafka`), as in Docker Compose files: they are not settings, so they are not validated.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        data = apply_overrides(data, overrides)
    except OverrideError as err:
        raise ConfigError(source, [str(err)]) from None

    problems: list[str] = []
    data = _interpolate(data, (), environ, problems, lines)
    if problems:
        raise ConfigError(source, problems)
    try:
        pipeline = Pipeline.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, describe(err, (), lines, Pipeline)) from None

    try:
        engine_type = engine_types.lookup(pipeline.engine.type)
    except ImportError as err:
        raise ConfigError(source, [f"{where(('engine', 'type'), lines)}: engine '{pipeline.engine.type}' is not "
                                   f"available in this installation ({err})"]) from None
    try:
        # base_dir: engine options may name files relative to the pipeline file (a JSON Schema, say)
        options = engine_type.options.model_validate(pipeline.engine.raw_options(),
                                                     context={"base_dir": base_dir or Path.cwd()})
    except ValidationError as err:
        raise ConfigError(source, describe(err, ("engine",), lines, engine_type.options)) from None
    found = check_applicable(pipeline, options, engine_type.continuous)
    if found.errors:
        raise ConfigError(source, [f"{where(loc, lines)}: {msg}" for loc, msg in found.errors])
    return LoadedPipeline(pipeline=pipeline, engine_options=options, base_dir=base_dir or Path.cwd(),
                          warnings=tuple(f"{where(loc, lines)}: {msg}" for loc, msg in found.warnings))


def _interpolate(value: Any, path: YamlPath, environ: Mapping[str, str], problems: list[str],
                 lines: dict[YamlPath, int]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, (*path, str(k)), environ, problems, lines) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, (*path, i), environ, problems, lines) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{where(path, lines)}: environment variable {name} is not set "
                        f"(set it, or give a default as ${{{name}:value}})")
        return ""

    return _ENV.sub(substitute, value)
