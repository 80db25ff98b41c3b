"""ONNX Runtime engine (``engine: {type: onnx}``): any task on TensorRT / CUDA / CPU execution providers.

``engine.task`` picks the task (:mod:`sluice.engines.tasks`: ``text-embedding`` by default,
``text-classification``, ``token-classification``, ``cross-encoder``, ``raw``); the task's options sit
beside the backend's under ``engine:``. The backend (:mod:`sluice.engines.onnx.onnx_backend`) loads a ``.onnx``
file, a directory with ``model.onnx``, or exports a plain Hugging Face directory once (cached).

All start-up problems raise :class:`EngineStartError` with one line. onnxruntime is imported in
``start``, never at module import.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from sluice.engines.engine_contract import EngineContext
from sluice.engines.engine_types import EngineType
from sluice.engines.onnx import execution_providers
from sluice.engines.onnx.onnx_backend import OnnxBackend
from sluice.engines.task_engine import TaskEngine
from sluice.engines.tasks.engine_options import EngineTaskOptions


class OnnxOptions(EngineTaskOptions):
    """Everything under ``engine:`` for ``type: onnx``."""

    model: str = Field(min_length=1)
    """A known model name, a `.onnx` file, a directory with `model.onnx`, or a Hugging Face directory
    (exported to ONNX once, cached)."""
    providers: list[Annotated[str, AfterValidator(execution_providers.full_name)]] = Field(
        default_factory=lambda: list(execution_providers.DEFAULT_PROVIDERS), min_length=1)
    """Execution providers, tried in order (`tensorrt`, `cuda`, `cpu` or full onnxruntime names); unavailable
    ones are skipped, and one info line names the provider used (a warning only when no listed one can be)."""
    intra_op_num_threads: int | None = Field(default=None, ge=0)  # None/0: onnxruntime's default
    """Threads within one operator (`0`: onnxruntime's default)."""
    inter_op_num_threads: int | None = Field(default=None, ge=0)
    """Threads across operators (`0`: onnxruntime's default)."""
    intra_op_spinning: bool = False
    """Let onnxruntime's threads busy-wait between operators; `false` leaves the cores to Sluice's intake and
    output threads."""
    flush_denormals: bool = True
    """Flush denormal floats to zero while the model runs (each costs the CPU a slow microcode assist); turn
    off for a model that takes the log of tiny probabilities."""
    export_cache_dir: str | None = None
    """Where exports of Hugging Face directories are kept (default: `<sluice cache>/exports`)."""
    quantize: Literal["none", "int8"] = "none"
    """`int8`: the model's matmuls rewritten to int8 weights with per-token activations (made once, cached;
    its cosine to the float32 outputs is logged at start); `none`."""


class OnnxEngine(TaskEngine):
    """The task on an ONNX Runtime session."""

    backend: OnnxBackend

    def __init__(self, options: OnnxOptions, context: EngineContext) -> None:
        super().__init__("onnx", options, OnnxBackend(options, context), context)
        self.int8_agreement: tuple[float, float] | None = None  # after start() with quantize: int8

    def start(self) -> None:
        super().start()
        if self.options.quantize == "int8" and self.task is not None:
            self._check_int8()

    def _check_int8(self) -> None:
        """Run the probe texts through the float32 model too, and log how close the int8 outputs are."""
        from sluice.engines.onnx.int8 import PROBE_TEXTS, agreement

        assert self.task is not None and self.backend.load_request is not None
        reference = OnnxBackend(self.options.model_copy(update={"quantize": "none"}), self.context)
        reference.locate()
        reference.open(self.backend.load_request)
        try:
            self.int8_agreement = agreement(self.task, self.backend, reference)
        finally:
            reference.close()
        low, mean = self.int8_agreement
        log.info("onnx engine: int8 model %s; cosine to the float32 model's outputs on %d probe texts: min %.4f, "
                 "mean %.4f", self.backend.model_file, len(PROBE_TEXTS), low, mean)

    @property
    def providers_used(self) -> list[str]:
        """After start(): the providers the session really runs on."""
        return self.backend.providers_used


log = logging.getLogger(__name__)

ENGINE_TYPE = EngineType(name="onnx", options=OnnxOptions, factory=OnnxEngine)
