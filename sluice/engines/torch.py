"""PyTorch engine (``engine: {type: torch}``): an HF encoder, a factory's module, TorchScript or ``torch.export``.

Tasks, as in the ONNX engine (same pipeline file apart from ``engine.type``):

* ``text-embedding`` (default): ``model`` is a known model name or a Hugging Face directory (``config.json``,
  safetensors, ``tokenizer.json``), loaded offline with ``transformers.AutoModel``. ``prepare`` tokenises,
  ``infer`` pads per batch, runs the encoder, mean-pools on the device and L2-normalises
  (:mod:`sluice.engines.text_embedding`).
* ``raw``: the module comes from ``factory`` (``package.module:function`` returning an ``nn.Module``),
  ``torchscript`` (a ``torch.jit.save`` file) or ``exported`` (a ``torch.export.save`` ``.pt2``). It is
  called with one positional tensor per entry of ``inputs`` (model input name -> record field), in that
  order; ``input_shapes`` gives each input's per-record shape (default ``[null]``: a vector of any length)
  and ``input_dtypes`` its dtype (default float32). Results are ``{name: array}`` for the names in
  ``outputs`` (a tensor, a tuple/list in that order, or a dict holding those keys).

Device: ``auto`` takes the first CUDA GPU when one is visible, else the CPU; ``cuda``/``cuda:N`` pinned
without a GPU is a start-up error. ``dtype`` float16/bfloat16 applies on CUDA only: on a CPU the engine
logs a warning and runs float32 (so one pipeline file serves both). Inference runs under
``torch.inference_mode``; on CUDA inputs go through pinned host buffers with non-blocking copies.
``compile: true`` wraps the module in ``torch.compile(dynamic=True)``, compiled during warm-up.

torch (and transformers) are imported in ``start``, never at module import. ``import torch`` here is the
real torch: absolute imports never resolve to this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sluice.engines import torch_device, torch_models
from sluice.engines.base import BatchEngine, EngineContext, EngineStartError, first_line
from sluice.engines.raw_task import RawTask
from sluice.engines.registry import EngineType
from sluice.engines.text_embedding import (
    TextEmbeddingTask,
    TokenizedText,
    format_vectors,
    item_length,
    l2_normalize,
    load_task,
    pad_batch,
)
from sluice.engines.text_embedding import (
    result_schema as embedding_result_schema,
)

_NUMPY_TYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


class TorchOptions(BaseModel):
    """Everything under ``engine:`` for ``type: torch``. Exactly one of model/factory/torchscript/exported."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, min_length=1)  # text-embedding: known name or HF directory
    factory: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # pkg.module:function
    factory_kwargs: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of the factory call
    torchscript: str | None = Field(default=None, min_length=1)  # path of a torch.jit.save file
    exported: str | None = Field(default=None, min_length=1)  # path of a torch.export.save .pt2 file
    task: Literal["text-embedding", "raw"] = "text-embedding"
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # half types on CUDA only (else float32)
    compile: bool = False  # torch.compile(dynamic=True); the first batches pay the compilation in warm-up
    inputs: dict[str, str] = Field(default_factory=dict)  # raw: module argument name -> record field
    input_shapes: dict[str, list[int | None]] = Field(default_factory=dict)  # raw: per-record shape
    input_dtypes: dict[str, Literal["float32", "int64", "int32", "bool"]] = Field(default_factory=dict)
    outputs: list[str] = Field(default_factory=lambda: ["output"], min_length=1)  # raw: result names
    max_length: int = Field(default=256, ge=2, le=65_536)  # text-embedding: truncate to this many tokens
    normalize: bool = True  # text-embedding: L2-normalise the pooled vectors
    output_format: Literal["list", "base64"] = "list"
    warmup: bool = True

    @model_validator(mode="after")
    def _one_source_that_fits_the_task(self) -> TorchOptions:
        sources = [k for k in ("model", "factory", "torchscript", "exported") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise ValueError(f"give exactly one of model, factory, torchscript, exported (got {sources or 'none'})")
        if self.task == "text-embedding" and sources != ["model"]:
            raise ValueError("task text-embedding loads a Hugging Face model: use 'model' (or task: raw)")
        if self.task == "raw":
            if sources == ["model"]:
                raise ValueError("task raw runs a factory, torchscript or exported module, not 'model'")
            if not self.inputs:
                raise ValueError("task 'raw' needs 'inputs' (module argument name -> record field)")
            extra = sorted((set(self.input_shapes) | set(self.input_dtypes)) - set(self.inputs))
            if extra:
                raise ValueError(f"input_shapes/input_dtypes name {extra}, which are not in 'inputs'")
        elif self.inputs or self.input_shapes or self.input_dtypes:
            raise ValueError("'inputs', 'input_shapes', 'input_dtypes' are only used with task 'raw'")
        if self.factory_kwargs and self.factory is None:
            raise ValueError("'factory_kwargs' is only used with 'factory'")
        return self


class TorchEngine(BatchEngine):
    """A batch engine over one torch module; see the module docstring."""

    def __init__(self, options: TorchOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._torch: Any = None
        self._module: Any = None
        self._staging: torch_device.HostStaging | None = None
        self._embedding: TextEmbeddingTask | None = None
        self._raw: RawTask | None = None
        self.device: Any = None  # after start(): the torch.device the module runs on
        self.dtype: Any = None  # after start(): the compute dtype

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            import torch
        except ImportError:
            raise EngineStartError("engine torch: the 'torch' package is not installed "
                                   "(pip install 'sluice[torch]')") from None
        self._torch = torch
        self.device = torch_device.resolve_device(torch, self.options.device, "torch")
        self.dtype = torch_device.resolve_dtype(torch, self.options.dtype, self.device, "torch")
        module = self._load()
        if self.options.exported is None:
            module = module.to(device=self.device, dtype=self.dtype)
        if self.options.compile:
            module = torch.compile(module, dynamic=True)
        self._module = module
        self._staging = torch_device.HostStaging(torch, self.device)
        if self.options.warmup:
            self._warm_up()

    def result_schema(self) -> dict[str, Any] | None:
        return embedding_result_schema(self.options.output_format) if self._embedding is not None else None

    def close(self) -> None:
        self._module = None
        self._staging = None
        if self._torch is not None and self.device is not None and self.device.type == "cuda":
            self._torch.cuda.empty_cache()

    # -------------------------------------------------------------------------------- per record

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        if self._raw is not None:
            return [self._raw.prepare(value) for value in values]
        if self._embedding is None:
            raise RuntimeError("TorchEngine.prepare called before start()")
        return self._embedding.prepare(values)

    def item_length(self, item: Any) -> int:
        return item_length(item)

    def infer(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        with self._torch.inference_mode():
            if self._raw is not None:
                return self._raw.infer(items, self._run_raw, self.options.output_format)
            return self._infer_embeddings(items)

    # ------------------------------------------------------------------------------------ internals

    def _infer_embeddings(self, items: Sequence[TokenizedText]) -> list[Any]:
        assert self._embedding is not None and self._staging is not None  # set in start(); not user input
        batch = pad_batch(items, self._embedding.pad_id)
        input_ids = self._staging.to_device("input_ids", batch.input_ids)  # (batch, tokens) int64
        attention_mask = self._staging.to_device("attention_mask", batch.attention_mask)  # (batch, tokens)
        hidden = self._module(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        vectors = torch_device.mean_pool(self._torch, hidden, attention_mask)  # (batch, dim) float32
        if self.options.normalize:
            vectors = l2_normalize(vectors)
        return format_vectors(vectors, self.options.output_format)

    def _run_raw(self, feeds: dict[str, np.ndarray], output_names: list[str]) -> list[np.ndarray]:
        """One module call: positional tensors in ``inputs`` order -> one numpy array per output name."""
        assert self._staging is not None  # set in start(); not user input
        args = []
        for name in self.options.inputs:
            array = feeds[name]
            floating = np.issubdtype(array.dtype, np.floating)
            args.append(self._staging.to_device(name, array, self.dtype if floating else None))
        returned = self._module(*args)
        if isinstance(returned, dict):
            missing = [n for n in output_names if n not in returned]
            if missing:
                raise ValueError(f"the module returned keys {sorted(returned)}; 'outputs' names {missing}")
            tensors = [returned[n] for n in output_names]
        else:
            tensors = list(returned) if isinstance(returned, (tuple, list)) else [returned]
            if len(tensors) != len(output_names):
                raise ValueError(f"the module returned {len(tensors)} output(s); 'outputs' names "
                                 f"{len(output_names)}: {output_names}")
        return [_to_numpy(self._torch, t) for t in tensors]

    def _load(self) -> Any:
        options = self.options
        if options.factory is not None:
            module = torch_models.load_factory(options.factory, dict(options.factory_kwargs))
        elif options.torchscript is not None:
            module = torch_models.load_torchscript(self._path(options.torchscript))
        elif options.exported is not None:
            if self.dtype != self._torch.float32:
                raise EngineStartError("engine torch: an exported program runs in the dtype it was exported "
                                       "with; set dtype: float32")
            module = torch_models.load_exported(self._path(options.exported), self.device)
        else:
            return self._load_text_embedding()
        self._raw = _raw_task(options)
        return module

    def _load_text_embedding(self) -> Any:
        assert self.options.model is not None  # the options validator guarantees it
        model_dir = self._path(self.options.model)
        if not model_dir.is_dir():
            raise EngineStartError(f"engine torch: 'model' must be a known model name or a Hugging Face model "
                                   f"directory; {model_dir} is a file")
        self._embedding = load_task(model_dir, self.options.max_length)
        return torch_models.load_hf_encoder(model_dir)

    def _path(self, name_or_path: str) -> Path:
        from sluice.models import ModelError, resolve_model

        try:
            return resolve_model(name_or_path, base_dir=self.context.pipeline_dir)
        except ModelError as err:
            raise EngineStartError(str(err)) from None

    def _warm_up(self) -> None:
        """Batch 1 and the largest batch (also compiles, with ``compile: true``) so records pay no setup."""
        num_large = max(1, min(self.context.max_batch_size, 64))
        try:
            with self._torch.inference_mode():
                if self._embedding is not None:
                    for size in sorted({1, num_large}):
                        self._infer_embeddings(self._embedding.tokenize(["warm-up run"] * size))
                elif self._raw is not None:
                    self._raw.warm_up(self._run_raw)
        except Exception as err:
            raise EngineStartError(f"engine torch: warm-up run of the model failed: "
                                   f"{first_line(err)}") from None


def _raw_task(options: TorchOptions) -> RawTask:
    """The shared raw task over the declared inputs (names, per-record shapes, dtypes)."""
    declared = [SimpleNamespace(name=name, shape=["batch", *options.input_shapes.get(name, [None])])
                for name in options.inputs]
    feed_types = {name: _NUMPY_TYPES[options.input_dtypes.get(name, "float32")] for name in options.inputs}
    return RawTask(declared, options.inputs, feed_types, options.outputs)


def _to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"the module returned a {type(tensor).__name__}, not a tensor")
    if tensor.is_floating_point():
        tensor = tensor.float()
    array: np.ndarray = tensor.detach().cpu().numpy()
    return array


def _make(options: TorchOptions, context: EngineContext) -> TorchEngine:
    return TorchEngine(options, context)


ENGINE_TYPE = EngineType(name="torch", options=TorchOptions, factory=_make)
