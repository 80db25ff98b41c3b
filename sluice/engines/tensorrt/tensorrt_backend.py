"""Native TensorRT backend: an engine built from ONNX, run on its own CUDA stream.

``model`` is what the ONNX backend takes: a ``.onnx`` file, a directory with ``model.onnx``, or a plain
Hugging Face directory, exported to ONNX for the task's head first (the same cached export).

At ``open``:

1. Everything missing -- an NVIDIA GPU, the ``tensorrt`` package, torch -- is named in one
   :class:`EngineStartError` line, before anything is loaded.
2. The optimisation profile comes from the pipeline: (1, 1) .. (``max_batch_size``, the task's
   ``max_length``), tuned for (``max_batch_size`` / 2, ``opt_tokens``) (:mod:`sluice.engines.tensorrt.build_plan`).
3. The engine is loaded from ``engine_cache_dir`` when it was built before for the same model bytes,
   TensorRT version, GPU model, profile and precision; else built (tens of seconds) and cached
   (:mod:`sluice.engines.tensorrt.engine_build`).

``run`` copies the feeds from pinned host buffers to torch CUDA tensors on the engine's stream, binds them
with ``set_input_shape`` / ``set_tensor_address``, runs ``execute_async_v3`` on that stream and returns the
output tensors; the task's post-processing runs on the same stream (``inference``), so pooling happens on
the GPU and only the vectors are copied back. tensorrt and torch are imported in ``open``.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.arrays import TorchOps
from sluice.engines.backends.backend_contract import Backend, LoadRequest, ModelFiles, ModelIO, TensorSpec
from sluice.engines.engine_contract import EngineContext, EngineStartError, first_line
from sluice.engines.onnx.onnx_backend import locate_onnx, onnx_file
from sluice.engines.tensorrt import build_plan
from sluice.engines.tensorrt.engine_build import BuildRequest, LoadedEngine, load_or_build
from sluice.engines.torch import placement

_TORCH_TO_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32, "int32": np.int32,
                   "int64": np.int64, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}


class TensorrtBackend(Backend):
    """See the module docstring. ``options`` is the engine's TensorrtOptions."""

    def __init__(self, options: Any, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._files: ModelFiles | None = None
        self._torch: Any = None
        self._loaded: LoadedEngine | None = None
        self._context: Any = None  # trt.IExecutionContext
        self._stream: Any = None  # torch.cuda.Stream
        self._staging: placement.HostStaging | None = None
        self._input_dtypes: dict[str, Any] = {}  # engine input name -> torch dtype
        self._output_dtypes: dict[str, Any] = {}  # engine output name -> torch dtype
        self._in_flight: dict[str, Any] = {}  # the last run's device inputs, alive until the next run
        self.profile: build_plan.ShapeProfile | None = None  # after open()
        self.device: Any = None
        self.plan_path: Path | None = None  # after open(): the cached engine file
        self.built: bool = False  # after open(): True when this start built the engine

    def model_reference(self) -> str | None:
        return str(self.options.model)

    def locate(self) -> ModelFiles:
        has_torch = importlib.util.find_spec("torch") is not None
        error = build_plan.missing_requirements(has_gpu=gpu_visible(has_torch),
                                                   has_tensorrt=importlib.util.find_spec("tensorrt") is not None,
                                                   has_torch=has_torch)
        if error:
            raise EngineStartError(error)
        self._files = self.find()
        return self._files

    def find(self) -> ModelFiles:
        return locate_onnx(self.options.model, self.context, "tensorrt")

    def open(self, request: LoadRequest) -> ModelIO:
        import torch

        try:
            import tensorrt as trt
        except (ImportError, OSError) as err:  # a wheel for another CUDA major, a missing libnvinfer...
            raise EngineStartError(f"engine tensorrt: cannot import tensorrt: {first_line(err)}") from None
        if request.max_tokens is None:
            raise EngineStartError("engine tensorrt runs text tasks ((batch, tokens) inputs) only")
        assert self._files is not None  # locate() comes first
        self._torch = torch
        self.device = placement.resolve_device(torch, self.options.device, "tensorrt")
        torch.cuda.set_device(self.device)  # one process serves one model on one device
        model_file = onnx_file(self._files, request, self.options.export_cache_dir, self.context)
        self.profile = build_plan.shape_profile(request.max_batch_size, request.max_tokens, self.options.opt_tokens)
        major, minor = torch.cuda.get_device_capability(self.device)
        build = BuildRequest(onnx_path=model_file, profile=self.profile, fp16=self.options.fp16,
                             workspace_bytes=self.options.workspace_mb << 20,
                             gpu_name=f"{torch.cuda.get_device_name(self.device)} sm_{major}{minor}",
                             cache_dir=self._cache_dir())
        self._loaded = load_or_build(trt, build)
        self.plan_path, self.built = self._loaded.plan_path, self._loaded.built
        io = self.bind_engine(trt, torch, self._loaded.engine)
        self._context = self._loaded.engine.create_execution_context()
        self._stream = torch.cuda.Stream(self.device)
        self._staging = placement.HostStaging(torch, self.device)
        self.ops = TorchOps(torch, self.device, self._staging)
        return io

    def bind_engine(self, trt: Any, torch: Any, engine: Any) -> ModelIO:
        """The engine's IO tensors, as ModelIO; remembers their torch dtypes."""
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        self._input_dtypes = {n: torch_dtype(trt, torch, engine.get_tensor_dtype(n)) for n in inputs}
        self._output_dtypes = {n: torch_dtype(trt, torch, engine.get_tensor_dtype(n)) for n in outputs}

        def spec(name: str, dtype: Any) -> TensorSpec:
            return TensorSpec(name=name, dtype=_TORCH_TO_NUMPY.get(str(dtype).removeprefix("torch."), np.float32),
                              shape=(None, None))

        return ModelIO(inputs=tuple(spec(n, d) for n, d in self._input_dtypes.items()),
                       outputs=tuple(spec(n, d) for n, d in self._output_dtypes.items()))

    def inference(self) -> AbstractContextManager[Any]:
        stack = ExitStack()
        stack.enter_context(self._torch.inference_mode())
        stack.enter_context(self._torch.cuda.stream(self._stream))
        return stack

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        """Runs on the engine's stream; called inside :meth:`inference`."""
        assert self._staging is not None and self.profile is not None  # set in open(); not user input
        torch = self._torch
        num_rows, num_tokens = next(iter(feeds.values())).shape[:2]
        if not self.profile.fits(num_rows, num_tokens):
            raise ValueError(f"batch ({num_rows} x {num_tokens}) is outside the engine's profile {self.profile}")
        on_device = {}  # name -> (batch, tokens) tensor; kept alive until the stream has run (next call)
        for name, dtype in self._input_dtypes.items():
            on_device[name] = self._staging.to_device(name, feeds[name], dtype)
            self._context.set_input_shape(name, (num_rows, num_tokens))
            self._context.set_tensor_address(name, on_device[name].data_ptr())
        outputs = {}
        for name, dtype in self._output_dtypes.items():
            shape = tuple(self._context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, dtype=dtype, device=self.device)
            self._context.set_tensor_address(name, outputs[name].data_ptr())
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        self._in_flight = on_device
        return [outputs[name] for name in output_names]

    def close(self) -> None:
        self._context = None
        self._loaded = None
        self._staging = None
        self._in_flight = {}

    def _cache_dir(self) -> Path:
        if self.options.engine_cache_dir is None:
            from sluice.model_store import default_cache_dir

            return default_cache_dir() / "tensorrt"
        path = Path(self.options.engine_cache_dir).expanduser()
        return path if path.is_absolute() else Path(self.context.pipeline_dir) / path


def gpu_visible(has_torch: bool) -> bool:
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


def torch_dtype(trt: Any, torch: Any, trt_dtype: Any) -> Any:
    table = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
             "INT64": torch.int64, "BOOL": torch.bool, "INT8": torch.int8, "UINT8": torch.uint8}
    for name, dtype in table.items():
        if getattr(trt.DataType, name, None) == trt_dtype:
            return dtype
    raise EngineStartError(f"engine tensorrt: tensor type {trt_dtype} is not supported by this engine")
