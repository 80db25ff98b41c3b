"""Engine ``python``: a user function, given by import path, that maps a list of inputs to a list of results.

```yaml
engine:
  type: python
  function: mypackage.enrich:classify   # def classify(inputs: list) -> list  (same length, same order)
```
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluice.engines.base import BatchEngine, EngineContext, EngineError, EngineStartError
from sluice.engines.registry import EngineType


class PythonOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    function: str = Field(description="package.module:function taking a list and returning a list")
    # JSON Schema of one result, for schema-registry outputs (avro, json_schema) to derive theirs from
    result_schema: dict[str, Any] | None = None

    @field_validator("function")
    @classmethod
    def _shape(cls, value: str) -> str:
        module, _, attr = value.partition(":")
        if not module or not attr:
            raise ValueError("expected 'package.module:function'")
        return value


class PythonEngine(BatchEngine):
    def __init__(self, options: PythonOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._fn: Callable[[list[Any]], Any] | None = None

    def start(self) -> None:
        module_name, _, attr = self.options.function.partition(":")
        # Let pipelines refer to modules next to the pipeline file, like a script would.
        for directory in (self.context.pipeline_dir, "."):
            if directory not in sys.path:
                sys.path.append(str(Path(directory)))
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise EngineStartError(f"engine.function: cannot import module '{module_name}': {err}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise EngineStartError(f"engine.function: module '{module_name}' has no function '{attr}'")
        self._fn = fn

    def result_schema(self) -> dict[str, Any] | None:
        return self.options.result_schema

    def infer(self, items: Sequence[Any]) -> list[Any]:
        assert self._fn is not None, "start() must be called before infer()"
        results = self._fn(list(items))
        if not isinstance(results, (list, tuple)) or len(results) != len(items):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
            raise EngineError(f"{self.options.function} returned {got} for {len(items)} inputs; "
                              "it must return a list with one result per input")
        return list(results)


ENGINE_TYPE = EngineType(name="python", options=PythonOptions, factory=PythonEngine)
