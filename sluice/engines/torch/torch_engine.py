"""PyTorch engine (``engine: {type: torch}``): any task on a Hugging Face model, or raw in-code modules.

The same pipeline file as the ONNX engine apart from ``engine.type``: ``engine.task`` picks the task
(:mod:`sluice.engines.tasks`), ``model`` a known model name or a Hugging Face directory, loaded with the
task's head. Task ``raw`` runs a ``factory`` (``package.module:function`` returning an ``nn.Module``), a
``torchscript`` file or an ``exported`` ``torch.export`` program instead (:mod:`sluice.engines.torch.torch_backend`).

Device: ``auto`` takes the first CUDA GPU when one is visible, else the CPU; ``cuda``/``cuda:N`` pinned
without a GPU is a start-up error. ``dtype`` float16/bfloat16 applies on CUDA only: on a CPU the engine
logs a warning and runs float32 (so one pipeline file serves both). ``compile: true`` wraps the module in
``torch.compile(dynamic=True)``, compiled during warm-up.

torch (and transformers) are imported in ``start``, never at module import. ``import torch`` elsewhere is
the real torch: absolute imports never resolve to this module.

Built in code (a benchmark, a GPU check)::

    from sluice.engines import engine_types
    from sluice.engines.engine_contract import EngineContext
    kind = engine_types.lookup("torch")
    engine = kind.factory(kind.options(model="path/to/hf-dir", device="cuda"), EngineContext(max_batch_size=64))
    engine.start()
    vectors = engine.infer(engine.prepare(["a text", "another"]))
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from sluice.engines.engine_contract import EngineContext
from sluice.engines.engine_types import EngineType
from sluice.engines.task_engine import TaskEngine
from sluice.engines.tasks.engine_options import EngineTaskOptions
from sluice.engines.torch.torch_backend import TorchBackend


class TorchOptions(EngineTaskOptions):
    """Everything under ``engine:`` for ``type: torch``. Exactly one of model/factory/torchscript/exported."""

    model: str | None = Field(default=None, min_length=1)
    """Text tasks: a known model name or a Hugging Face directory."""
    factory: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """Task `raw`: `package.module:function` returning a `torch.nn.Module`."""
    factory_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the factory call."""
    torchscript: str | None = Field(default=None, min_length=1)
    """Task `raw`: a `torch.jit.save` file."""
    exported: str | None = Field(default=None, min_length=1)
    """Task `raw`: a `torch.export.save` (`.pt2`) file."""
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """`auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`."""
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """`float32`, or `float16` / `bfloat16` (CUDA only)."""
    compile: bool = False
    """`torch.compile` the model (dynamic shapes); the first batches pay the compilation during warm-up."""
    input_shapes: dict[str, list[int | None]] = Field(default_factory=dict)
    """Task `raw`: each input's per-record shape."""
    input_dtypes: dict[str, Literal["float32", "int64", "int32", "bool"]] = Field(default_factory=dict)
    """Task `raw`: each input's dtype."""
    outputs: list[str] = Field(default_factory=lambda: ["output"], min_length=1)
    """Task `raw`: the names of the module's outputs, in order."""

    @model_validator(mode="after")
    def _one_source_that_fits_the_task(self) -> TorchOptions:
        sources = [k for k in ("model", "factory", "torchscript", "exported") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise ValueError(f"give exactly one of model, factory, torchscript, exported (got {sources or 'none'})")
        if self.task == "raw":
            if sources == ["model"]:
                raise ValueError("task raw runs a factory, torchscript or exported module, not 'model'")
            extra = sorted((set(self.input_shapes) | set(self.input_dtypes)) - set(self.inputs))
            if extra:
                raise ValueError(f"input_shapes/input_dtypes name {extra}, which are not in 'inputs'")
        else:
            if sources != ["model"]:
                raise ValueError(f"task {self.task} loads a Hugging Face model: use 'model' (or task: raw)")
            if self.input_shapes or self.input_dtypes or "outputs" in self.model_fields_set:
                raise ValueError("'input_shapes', 'input_dtypes', 'outputs' are only used with task 'raw'")
        if self.factory_kwargs and self.factory is None:
            raise ValueError("'factory_kwargs' is only used with 'factory'")
        return self


class TorchEngine(TaskEngine):
    """The task on a torch module."""

    backend: TorchBackend

    def __init__(self, options: TorchOptions, context: EngineContext) -> None:
        super().__init__("torch", options, TorchBackend(options, context), context)

    @property
    def device(self) -> Any:
        """After start(): the torch.device the module runs on."""
        return self.backend.device

    @property
    def dtype(self) -> Any:
        """After start(): the compute dtype."""
        return self.backend.dtype


ENGINE_TYPE = EngineType(name="torch", options=TorchOptions, factory=TorchEngine)
