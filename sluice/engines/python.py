"""Engine ``python``: a user function, given by import path, that maps a list of inputs to a list of results.

```yaml
engine:
  type: python
  function: mypackage.enrich:classify   # def classify(inputs: list) -> list  (same length, same order)
```

A model kept in a file (a pickle, a JSON table, weights a library loads) is given as ``model`` with a
``factory`` that loads it; then outputs name that file's content, and ``engine.reload`` can roll a new
version of it out while the pipeline runs:

```yaml
engine:
  type: python
  factory: mypackage.enrich:load        # def load(model: pathlib.Path) -> Callable[[list], list]
  model: models/current                 # a file or directory, relative to the pipeline file
```
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.engines.engine_contract import (
    BatchEngine,
    EngineContext,
    EngineError,
    EngineStartError,
    first_line,
)
from sluice.engines.engine_types import EngineType
from sluice.engines.identity import ModelSource, code_source
from sluice.engines.model_source import disk_source


class PythonOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), use_attribute_docstrings=True)
    function: str | None = Field(default=None, description="package.module:function taking a list and "
                                                            "returning a list")
    """`package.module:function` taking a list of inputs and returning a list of results, one per input, in
    order."""
    factory: str | None = None
    """`package.module:function` taking the model's path and returning such a function (with `model`;
    reloadable)."""
    model: str | None = Field(default=None, min_length=1)
    """A file or directory the factory loads (relative to the pipeline file)."""
    result_schema: dict[str, Any] | None = None
    """The JSON Schema of one result, for Schema Registry outputs (`avro`, `json_schema`) to derive theirs
    from."""

    @field_validator("function", "factory")
    @classmethod
    def _shape(cls, value: str | None) -> str | None:
        if value is None:
            return value
        module, _, attr = value.partition(":")
        if not module or not attr:
            raise ValueError("expected 'package.module:function'")
        return value

    @model_validator(mode="after")
    def _function_or_factory(self) -> PythonOptions:
        if (self.function is None) == (self.factory is None):
            raise ValueError("give exactly one of 'function' (a batch function) or 'factory' (with 'model': "
                             "a function loading the model file and returning the batch function)")
        if (self.factory is None) != (self.model is None):
            raise ValueError("'factory' and 'model' go together: the factory is called with the model's path")
        return self


class PythonEngine(BatchEngine):
    def __init__(self, options: PythonOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._fn: Callable[[list[Any]], Any] | None = None

    def model_source(self) -> ModelSource:
        if self.options.model is not None:
            return disk_source(self.options.model, self.context.pipeline_dir)
        self._extend_path()
        function = str(self.options.function)
        return code_source(function, function.partition(":")[0])

    def start(self) -> None:
        o = self.options
        self._extend_path()
        if o.factory is None:
            self._fn = self._import("function", str(o.function))
            return
        source = self.model_source()
        if source.path is None:
            raise EngineStartError(f"engine.model: {o.model!r} does not exist (relative paths start at the "
                                   f"pipeline file's directory, {self.context.pipeline_dir})")
        factory = self._import("factory", o.factory)
        try:
            fn = factory(source.path)
        except Exception as err:  # the user's loader refusing the file: one line, the old model keeps serving
            raise EngineStartError(f"engine.factory {o.factory} could not load {source.path}: "
                                   f"{type(err).__name__}: {first_line(err)}") from None
        if not callable(fn):
            raise EngineStartError(f"engine.factory {o.factory} returned {type(fn).__name__}, not a function")
        self._fn = fn

    def _extend_path(self) -> None:
        # Let pipelines refer to modules next to the pipeline file, like a script would.
        for directory in (self.context.pipeline_dir, "."):
            if directory not in sys.path:
                sys.path.append(str(Path(directory)))

    @staticmethod
    def _import(key: str, path: str) -> Callable[..., Any]:
        module_name, _, attr = path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise EngineStartError(f"engine.{key}: cannot import module '{module_name}': {err}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise EngineStartError(f"engine.{key}: module '{module_name}' has no function '{attr}'")
        return fn  # type: ignore[no-any-return]

    def result_schema(self) -> dict[str, Any] | None:
        return self.options.result_schema

    def infer(self, items: Sequence[Any]) -> list[Any]:
        assert self._fn is not None, "start() must be called before infer()"
        results = self._fn(list(items))
        if not isinstance(results, (list, tuple)) or len(results) != len(items):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
            name = self.options.function or f"the function from {self.options.factory}"
            raise EngineError(f"{name} returned {got} for {len(items)} inputs; "
                              "it must return a list with one result per input")
        return list(results)


ENGINE_TYPE = EngineType(name="python", options=PythonOptions, factory=PythonEngine)
