"""ONNX Runtime engine (``engine: {type: onnx}``): any task on TensorRT / CUDA / CPU execution providers.

``engine.task`` picks the task (:mod:`sluice.engines.tasks`: ``text-embedding`` by default,
``text-classification``, ``token-classification``, ``cross-encoder``, ``raw``); the task's options sit
beside the backend's under ``engine:``. The backend (:mod:`sluice.engines.backends.onnx`) loads a ``.onnx``
file, a directory with ``model.onnx``, or exports a plain Hugging Face directory once (cached).

All start-up problems raise :class:`EngineStartError` with one line. onnxruntime is imported in
``start``, never at module import.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from sluice.engines import onnx_providers
from sluice.engines.backends.onnx import OnnxBackend
from sluice.engines.base import EngineContext
from sluice.engines.registry import EngineType
from sluice.engines.task_engine import TaskEngine
from sluice.engines.tasks.engine_options import EngineTaskOptions


class OnnxOptions(EngineTaskOptions):
    """Everything under ``engine:`` for ``type: onnx``."""

    model: str = Field(min_length=1)  # a known model name, a .onnx file, a directory with model.onnx, an HF dir
    # Tried in order; short names (cpu, cuda, tensorrt) become full onnxruntime names.
    providers: list[Annotated[str, AfterValidator(onnx_providers.full_name)]] = Field(
        default_factory=lambda: list(onnx_providers.DEFAULT_PROVIDERS), min_length=1)
    intra_op_num_threads: int | None = Field(default=None, ge=0)  # None/0: onnxruntime's default
    inter_op_num_threads: int | None = Field(default=None, ge=0)
    # onnxruntime's worker threads busy-wait between operators by default. That wins in a loop that does
    # nothing else, but here the intake (decode, tokenise) and emitter threads need the same cores.
    intra_op_spinning: bool = False
    export_cache_dir: str | None = None  # exports of HF directories; default <sluice cache>/exports


class OnnxEngine(TaskEngine):
    """The task on an ONNX Runtime session."""

    backend: OnnxBackend

    def __init__(self, options: OnnxOptions, context: EngineContext) -> None:
        super().__init__("onnx", options, OnnxBackend(options, context), context)

    @property
    def providers_used(self) -> list[str]:
        """After start(): the providers the session really runs on."""
        return self.backend.providers_used


ENGINE_TYPE = EngineType(name="onnx", options=OnnxOptions, factory=OnnxEngine)
