"""Native TensorRT engine (``engine: {type: tensorrt}``): a text task on an engine built from ONNX.

The same pipeline file as the ONNX and torch engines apart from ``engine.type`` and the TensorRT options;
every text task runs here (``raw`` does not: the profile is over (batch, tokens) inputs). ``model`` is a
``.onnx`` file, a directory with ``model.onnx``, or a Hugging Face directory exported for the task first
(:mod:`sluice.engines.tensorrt.tensorrt_backend`). GPU-only: on a machine without one, start names what is missing.
"""

from __future__ import annotations

from pydantic import Field

from sluice.engines.engine_contract import EngineContext
from sluice.engines.engine_types import EngineType
from sluice.engines.task_engine import TaskEngine
from sluice.engines.tasks.engine_options import EngineTaskOptions
from sluice.engines.tensorrt.tensorrt_backend import TensorrtBackend


class TensorrtOptions(EngineTaskOptions):
    """Everything under ``engine:`` for ``type: tensorrt``."""

    text_only = True
    model: str = Field(min_length=1)
    """A known model name, a `.onnx` file, a directory with `model.onnx`, or a Hugging Face directory
    (exported to ONNX once)."""
    device: str = Field(default="cuda", pattern=r"^(auto|cuda(:\d+)?)$")
    """The GPU: `auto` (`cuda:0`), `cuda` or `cuda:N`."""
    fp16: bool = False  # TensorRT 10 only (its FP16 builder flag); TensorRT 11 uses the model's own types
    """Build the engine with TensorRT's FP16 flag (TensorRT 10; TensorRT 11 uses the model's own types)."""
    engine_cache_dir: str | None = None
    """Where built engines are kept (default: `<sluice cache>/tensorrt`; relative to the pipeline file)."""
    export_cache_dir: str | None = None
    """Where exports of Hugging Face directories are kept (default: `<sluice cache>/exports`)."""
    workspace_mb: int = Field(default=2048, ge=16)
    """The builder's scratch memory, in MiB."""
    opt_tokens: int | None = Field(default=None, ge=1)
    """The padded length the optimisation profile is tuned for."""


class TensorrtEngine(TaskEngine):
    """The task on a TensorRT execution context (``engine.backend.plan_path`` / ``.built`` after start)."""

    backend: TensorrtBackend

    def __init__(self, options: TensorrtOptions, context: EngineContext) -> None:
        super().__init__("tensorrt", options, TensorrtBackend(options, context), context)


ENGINE_TYPE = EngineType(name="tensorrt", options=TensorrtOptions, factory=TensorrtEngine)
