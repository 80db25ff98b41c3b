"""Native TensorRT engine (``engine: {type: tensorrt}``): an engine built from ONNX, run on a CUDA stream.

Task ``text-embedding`` only, the same as the ONNX and torch engines (same pipeline file apart from
``engine.type``): ``prepare`` tokenises, ``infer`` pads per batch, runs the engine, mean-pools on the GPU
and L2-normalises (:mod:`sluice.engines.text_embedding`).

At ``start``:

1. Everything missing -- an NVIDIA GPU, the ``tensorrt`` package, torch -- is named in one
   :class:`EngineStartError` line, before anything is loaded.
2. The optimisation profile comes from the pipeline: (1, 1) .. (``max_batch_size``, ``max_length``), tuned for
   (``max_batch_size`` / 2, ``opt_tokens``) (:func:`sluice.engines.tensorrt_plan.shape_profile`).
3. The engine is loaded from ``engine_cache_dir`` (default ``<sluice cache>/tensorrt``) when it was built
   before for the same model bytes, TensorRT version, GPU model, profile and precision; else built (tens of
   seconds) and cached (:mod:`sluice.engines.tensorrt_build`).

``infer`` copies the batch from pinned host buffers to torch CUDA tensors on the engine's own stream, binds
them with ``set_input_shape`` / ``set_tensor_address``, runs ``execute_async_v3`` on that stream and reads
back only the pooled vectors. tensorrt and torch are imported in ``start``, never at module import.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sluice.engines import tensorrt_plan, torch_device
from sluice.engines.base import BatchEngine, EngineContext, EngineStartError, first_line
from sluice.engines.registry import EngineType
from sluice.engines.tensorrt_build import BuildRequest, LoadedEngine, load_or_build
from sluice.engines.text_embedding import (
    TextEmbeddingTask,
    format_vectors,
    item_length,
    l2_normalize,
    load_task,
    pad_batch,
)

_EMBEDDING_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")  # (batch, tokens, dim): pooled here
_POOLED_OUTPUTS = ("sentence_embedding", "pooler_output_mean")  # (batch, dim): pooled in the graph


class TensorrtOptions(BaseModel):
    """Everything under ``engine:`` for ``type: tensorrt``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)  # a known model name, a .onnx file, or a directory with model.onnx
    task: Literal["text-embedding"] = "text-embedding"
    device: str = Field(default="cuda", pattern=r"^(auto|cuda(:\d+)?)$")  # auto = cuda:0
    fp16: bool = False  # TensorRT 10 only (its FP16 builder flag); TensorRT 11 uses the model's own types
    engine_cache_dir: str | None = None  # default <sluice cache dir>/tensorrt; relative to the pipeline file
    workspace_mb: int = Field(default=2048, ge=16)  # builder scratch memory
    max_length: int = Field(default=256, ge=2, le=65_536)  # truncation, and the profile's longest batch
    opt_tokens: int | None = Field(default=None, ge=1)  # padded length the profile is tuned for (128)
    normalize: bool = True
    output_format: Literal["list", "base64"] = "list"
    warmup: bool = True


class TensorrtEngine(BatchEngine):
    """A batch engine over one TensorRT execution context; see the module docstring."""

    def __init__(self, options: TensorrtOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self.profile = tensorrt_plan.shape_profile(context.max_batch_size, options.max_length, options.opt_tokens)
        self._torch: Any = None
        self._loaded: LoadedEngine | None = None
        self._context: Any = None  # trt.IExecutionContext
        self._stream: Any = None  # torch.cuda.Stream
        self._staging: torch_device.HostStaging | None = None
        self._embedding: TextEmbeddingTask | None = None
        self._input_dtypes: dict[str, Any] = {}  # engine input name -> torch dtype
        self._output_dtypes: dict[str, Any] = {}  # engine output name -> torch dtype
        self._output_name = ""
        self._output_is_pooled = False
        self.device: Any = None
        self.plan_path: Path | None = None  # after start(): the cached engine file
        self.built: bool = False  # after start(): True when this start built the engine

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        has_torch = importlib.util.find_spec("torch") is not None
        error = tensorrt_plan.missing_requirements(has_gpu=_gpu_visible(has_torch),
                                                   has_tensorrt=importlib.util.find_spec("tensorrt") is not None,
                                                   has_torch=has_torch)
        if error:
            raise EngineStartError(error)
        import torch

        try:
            import tensorrt as trt
        except (ImportError, OSError) as err:  # a wheel for another CUDA major, a missing libnvinfer...
            raise EngineStartError(f"engine tensorrt: cannot import tensorrt: {first_line(err)}") from None
        self._torch = torch
        self.device = torch_device.resolve_device(torch, self.options.device, "tensorrt")
        torch.cuda.set_device(self.device)  # one process serves one model on one device
        model_file = self._model_file()
        self._start_tokenizer(model_file)
        major, minor = torch.cuda.get_device_capability(self.device)
        request = BuildRequest(onnx_path=model_file, profile=self.profile, fp16=self.options.fp16,
                               workspace_bytes=self.options.workspace_mb << 20,
                               gpu_name=f"{torch.cuda.get_device_name(self.device)} sm_{major}{minor}",
                               cache_dir=self._cache_dir())
        self._loaded = load_or_build(trt, request)
        self.plan_path, self.built = self._loaded.plan_path, self._loaded.built
        self._bind_io_names(trt, self._loaded.engine, model_file.name)
        self._context = self._loaded.engine.create_execution_context()
        self._stream = torch.cuda.Stream(self.device)
        self._staging = torch_device.HostStaging(torch, self.device)
        if self.options.warmup:
            self._warm_up()

    def close(self) -> None:
        self._context = None
        self._loaded = None
        self._staging = None

    # -------------------------------------------------------------------------------- per record

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        if self._embedding is None:
            raise RuntimeError("TensorrtEngine.prepare called before start()")
        return self._embedding.prepare(values)

    def item_length(self, item: Any) -> int:
        return item_length(item)

    def infer(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        assert self._embedding is not None and self._staging is not None  # set in start(); not user input
        torch = self._torch
        batch = pad_batch(items, self._embedding.pad_id)
        num_rows, num_tokens = batch.input_ids.shape
        if not self.profile.fits(num_rows, num_tokens):
            raise ValueError(f"batch ({num_rows} x {num_tokens}) is outside the engine's profile {self.profile}")
        columns = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                   "token_type_ids": batch.token_type_ids}
        with torch.inference_mode(), torch.cuda.stream(self._stream):
            on_device = {}  # name -> (batch, tokens) tensor; alive until the stream has run
            for name, dtype in self._input_dtypes.items():
                on_device[name] = self._staging.to_device(name, columns[name], dtype)
                self._context.set_input_shape(name, (num_rows, num_tokens))
                self._context.set_tensor_address(name, on_device[name].data_ptr())
            outputs = {}
            for name, dtype in self._output_dtypes.items():
                shape = tuple(self._context.get_tensor_shape(name))
                outputs[name] = torch.empty(shape, dtype=dtype, device=self.device)
                self._context.set_tensor_address(name, outputs[name].data_ptr())
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
            output = outputs[self._output_name]
            if self._output_is_pooled:
                vectors = output.float().cpu().numpy()  # (batch, dim); .cpu() waits for the stream
            else:
                mask = on_device.get("attention_mask")  # (batch, tokens)
                if mask is None:  # a model without a mask input: its own pinned buffer, never shared
                    mask = self._staging.to_device("pooling_mask", batch.attention_mask)
                vectors = torch_device.mean_pool(torch, output, mask)  # (batch, dim) float32
        if self.options.normalize:
            vectors = l2_normalize(vectors)
        return format_vectors(vectors, self.options.output_format)

    # ------------------------------------------------------------------------------------ internals

    def _bind_io_names(self, trt: Any, engine: Any, model_name: str) -> None:
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        unexpected = [n for n in inputs if n not in _EMBEDDING_INPUTS]
        if unexpected or "input_ids" not in inputs:
            raise EngineStartError(f"engine tensorrt: model {model_name} takes inputs {inputs}; the "
                                   f"text-embedding task feeds {list(_EMBEDDING_INPUTS)}")
        token_level = [n for n in _TOKEN_OUTPUTS if n in outputs]
        pooled = [n for n in _POOLED_OUTPUTS if n in outputs]
        if not token_level and not pooled:
            raise EngineStartError(f"engine tensorrt: model {model_name} has outputs {outputs}; the "
                                   f"text-embedding task needs one of {list(_TOKEN_OUTPUTS + _POOLED_OUTPUTS)}")
        self._output_name, self._output_is_pooled = (token_level[0], False) if token_level else (pooled[0], True)
        self._input_dtypes = {n: _torch_dtype(trt, self._torch, engine.get_tensor_dtype(n)) for n in inputs}
        self._output_dtypes = {n: _torch_dtype(trt, self._torch, engine.get_tensor_dtype(n)) for n in outputs}

    def _model_file(self) -> Path:
        from sluice.models import ModelError, resolve_model_file

        try:
            return resolve_model_file(self.options.model, "model.onnx", base_dir=self.context.pipeline_dir)
        except ModelError as err:
            raise EngineStartError(str(err)) from None

    def _start_tokenizer(self, model_file: Path) -> None:
        self._embedding = load_task(model_file.parent, self.options.max_length)

    def _cache_dir(self) -> Path:
        if self.options.engine_cache_dir is None:
            from sluice.models import default_cache_dir

            return default_cache_dir() / "tensorrt"
        path = Path(self.options.engine_cache_dir).expanduser()
        return path if path.is_absolute() else Path(self.context.pipeline_dir) / path

    def _warm_up(self) -> None:
        assert self._embedding is not None  # set in start()
        num_large = max(1, min(self.context.max_batch_size, 64))
        try:
            for size in sorted({1, num_large}):
                self.infer(self._embedding.tokenize(["warm-up run"] * size))
        except Exception as err:
            raise EngineStartError(f"engine tensorrt: warm-up run failed: {first_line(err)}") from None


def _gpu_visible(has_torch: bool) -> bool:
    """True when torch sees a CUDA device; without torch, when the CUDA driver reports one."""
    if has_torch:
        import torch

        return bool(torch.cuda.is_available())
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except OSError:
        return False


def _torch_dtype(trt: Any, torch: Any, trt_dtype: Any) -> Any:
    table = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
             "INT64": torch.int64, "BOOL": torch.bool, "INT8": torch.int8, "UINT8": torch.uint8}
    for name, dtype in table.items():
        if getattr(trt.DataType, name, None) == trt_dtype:
            return dtype
    raise EngineStartError(f"engine tensorrt: tensor type {trt_dtype} is not supported by this engine")


def _make(options: TensorrtOptions, context: EngineContext) -> TensorrtEngine:
    return TensorrtEngine(options, context)


ENGINE_TYPE = EngineType(name="tensorrt", options=TensorrtOptions, factory=_make)
