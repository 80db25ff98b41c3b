"""Registry of engine types: the name under ``engine.type`` -> its options model and factory.

Engine modules are imported only when a pipeline names them, so a pipeline using the ``python`` engine
needs neither onnxruntime nor torch installed. Each engine module exposes ``ENGINE_TYPE`` and imports its
heavy libraries inside the factory, never at module import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sluice.engines.engine_contract import EngineContext

# engine type name -> module that defines ENGINE_TYPE
_MODULES: dict[str, str] = {
    "python": "sluice.engines.python",
    "onnx": "sluice.engines.onnx.onnx_engine",
    "torch": "sluice.engines.torch.torch_engine",
    "tensorrt": "sluice.engines.tensorrt.tensorrt_engine",
    "llm": "sluice.engines.llm.operator_engine",
}


@dataclass(frozen=True)
class EngineType:
    """One engine type: how its options are validated and how it is built."""

    name: str
    options: type[BaseModel]  # validates everything under ``engine:`` except ``type``
    factory: Callable[[Any, EngineContext], Any]  # (validated options, context) -> engine; must be cheap
    continuous: bool = False  # True for engines driven by add/step (the LLM engine)


def known_types() -> list[str]:
    """Engine type names, available or not on this machine."""
    return sorted(_MODULES)


def lookup(name: str) -> EngineType:
    """The engine type called ``name``. Raises KeyError for unknown names, ImportError when not built."""
    module_name = _MODULES[name]
    module = importlib.import_module(module_name)
    engine_type: EngineType = module.ENGINE_TYPE
    return engine_type
