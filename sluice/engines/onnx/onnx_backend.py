"""ONNX Runtime backend: one ``InferenceSession`` on TensorRT / CUDA / CPU execution providers.

``model`` is a known model name, a ``.onnx`` file, a directory holding ``model.onnx``, or a plain Hugging
Face directory (``config.json`` + weights): that one is exported to ONNX once for the task's head and the
export is cached by the directory's content (:mod:`sluice.model_store.export_cache`; exporting needs torch, so
an image without torch is given an export made with ``sluice models export``).

Providers are tried in the given order; one that this onnxruntime build lacks, or that fails to initialise
(no GPU), is skipped with a warning. An image-text model (CLIP, SigLIP) is two graphs, ``model.onnx`` (the
image tower) and ``model.text.onnx`` beside it; a batch runs on the one giving its output. On CUDA/TensorRT, outputs are bound with IO binding. onnxruntime is
imported in ``open``, never at module import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.arrays import NUMPY_OPS
from sluice.engines.backends.backend_contract import (
    Backend,
    LoadRequest,
    ModelClass,
    ModelFiles,
    ModelIO,
    TensorSpec,
)
from sluice.engines.engine_contract import EngineContext, EngineStartError, first_line
from sluice.engines.onnx import denormals, execution_providers

NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
               "tensor(double)": np.float64, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


def locate_onnx(model: str, context: EngineContext, engine: str) -> ModelFiles:
    """A model reference -> the ``.onnx`` file, or the HF directory to export one from; EngineStartError else."""
    from sluice.model_store import ModelError, resolve_model

    try:
        path = resolve_model(model, base_dir=context.pipeline_dir)
    except ModelError as err:
        raise EngineStartError(str(err)) from None
    if path.is_file():
        return ModelFiles(directory=path.parent, model_path=path)
    if (path / "model.onnx").is_file():
        return ModelFiles(directory=path, model_path=path / "model.onnx")
    if (path / "config.json").is_file() or (path / "modules.json").is_file():
        # A Hugging Face (or sentence-transformers) directory: exported at open, from the task's model_dir.
        return ModelFiles(directory=path, model_path=path)
    raise EngineStartError(f"engine {engine}: no model.onnx in {path}, and no Hugging Face model there "
                           "(config.json + weights) to export one from; point 'model' at a .onnx file or a "
                           "model directory")


def onnx_file(files: ModelFiles, request: LoadRequest, export_cache_dir: str | None, context: EngineContext) -> Path:
    """The ``.onnx`` file to load: the one given, or the (cached) export of the HF directory."""
    assert files.model_path is not None  # locate_onnx always sets it
    if files.model_path.is_file():
        return files.model_path
    if request.model_class is ModelClass.ANY or request.model_dir is None:
        raise EngineStartError(f"no model.onnx in {files.model_path}; task raw runs an ONNX file as it is")
    from sluice.model_store import ModelError
    from sluice.model_store.export_cache import exported_onnx

    cache_dir = None
    if export_cache_dir is not None:
        cache_dir = Path(export_cache_dir).expanduser()
        if not cache_dir.is_absolute():
            cache_dir = Path(context.pipeline_dir) / cache_dir
    try:
        return exported_onnx(request.model_dir, request.model_class, cache_dir=cache_dir,
                             trust_remote_code=request.trust_remote_code)
    except ModelError as err:
        raise EngineStartError(str(err)) from None


def _text_graph(model_file: Path) -> Path:
    """The text tower of an image-text model, beside its image tower (``model.onnx`` -> ``model.text.onnx``)."""
    from sluice.engines.torch.vision_graphs import text_graph_path

    path = text_graph_path(model_file)
    if not path.is_file():
        raise EngineStartError(f"an image-text model runs as two graphs: {model_file} (the image tower) and "
                               f"{path} (the text tower), which is missing; export both from the Hugging Face "
                               "directory (sluice models export DIR --task image-text-embedding)")
    return path


def _int8(model_file: Path, model_dir: Path | None) -> Path:
    from sluice.engines.onnx.int8 import int8_model

    try:
        return int8_model(model_file, tokenizer_dir=model_dir)
    except ImportError as err:
        raise EngineStartError(f"quantize: int8 needs the onnx package to rewrite the model ({err}); install the onnx "
                               "extra") from None
    except Exception as err:  # onnx / onnxruntime raise their own types for graphs they cannot quantise
        raise EngineStartError(f"cannot quantise {model_file} to int8: {first_line(err)}; use quantize: none") from None


def tensor_specs(nodes: Sequence[Any]) -> tuple[TensorSpec, ...]:
    """onnxruntime's NodeArg list as TensorSpecs (symbolic dimensions become None)."""
    return tuple(TensorSpec(name=node.name, dtype=NUMPY_TYPES.get(node.type, np.float32),
                            shape=tuple(d if isinstance(d, int) and d > 0 else None for d in node.shape))
                 for node in nodes)


class OnnxBackend(Backend):
    """See the module docstring. ``options`` is the engine's OnnxOptions."""

    def __init__(self, options: Any, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self.ops = NUMPY_OPS
        self._files: ModelFiles | None = None
        self._session: Any = None
        self._by_output: dict[str, Any] = {}  # output name -> the session giving it (image-text: two graphs)
        self._use_io_binding = False
        self._io_device = "cuda"
        self._flush_denormals = bool(getattr(options, "flush_denormals", True))
        self.model_file: Path | None = None  # after open(): the .onnx file the session runs
        self.load_request: LoadRequest | None = None  # after open(): what it was opened for
        self.providers_used: list[str] = []  # after open(): the providers the session really runs on

    def model_reference(self) -> str | None:
        return str(self.options.model)

    def memory_device(self) -> str:
        # The GPU providers take the first device unless told otherwise (Sluice does not tell them).
        return "cuda:0" if self._use_io_binding else "cpu"

    def locate(self) -> ModelFiles:
        self._files = locate_onnx(self.options.model, self.context, "onnx")
        return self._files

    def open(self, request: LoadRequest) -> ModelIO:
        import onnxruntime as ort

        assert self._files is not None  # locate() comes first
        model_file = onnx_file(self._files, request, self.options.export_cache_dir, self.context)
        if getattr(self.options, "quantize", "none") == "int8":
            if request.model_class.images:
                raise EngineStartError("quantize: int8 rewrites text models (it calibrates on texts); use quantize: "
                                       "none for an image model")
            model_file = _int8(model_file, request.model_dir)
        self.load_request = request
        providers = execution_providers.available_providers(ort, self.options.providers)
        session = self._load(ort, model_file, providers, request, token_inputs=request.max_tokens is not None
                             and not request.model_class.images)
        self.providers_used = list(session.get_providers())
        execution_providers.report_providers(self.options.providers, ort.get_available_providers(), self.providers_used)
        sessions = [session]
        if request.model_class is ModelClass.IMAGE_TEXT:  # the text tower is its own graph, beside model.onnx
            sessions.append(self._load(ort, _text_graph(model_file), providers, request, token_inputs=True))
        self._session = session
        self._by_output = {node.name: each for each in sessions for node in each.get_outputs()}
        self.model_file = model_file
        self._use_io_binding = self.providers_used[0] in execution_providers.GPU_PROVIDERS
        return ModelIO(inputs=tuple(spec for each in sessions for spec in tensor_specs(each.get_inputs())),
                       outputs=tuple(spec for each in sessions for spec in tensor_specs(each.get_outputs())))

    def _load(self, ort: Any, model_file: Path, providers: list[str], request: LoadRequest, *,
              token_inputs: bool) -> Any:
        try:
            with denormals.preserved():  # the session's option must not leave this thread flushing for good
                return ort.InferenceSession(
                    str(model_file), sess_options=self._session_options(ort),
                    providers=execution_providers.with_options(providers, model_file, max_batch_size=request.max_batch_size,
                                                          max_length=request.max_tokens or 1,
                                                          token_inputs=token_inputs))
        except Exception as err:  # onnxruntime raises its own exception types for bad files
            raise EngineStartError(f"cannot load ONNX model {model_file}: {first_line(err)}") from None

    def _session_options(self, ort: Any) -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.options.intra_op_num_threads is not None:
            options.intra_op_num_threads = self.options.intra_op_num_threads
        if not self.options.intra_op_spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.options.inter_op_num_threads is not None:
            options.inter_op_num_threads = self.options.inter_op_num_threads
        if self._flush_denormals:
            options.add_session_config_entry(denormals.SESSION_CONFIG_KEY, "1")
        return options

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        """One session run (the graph giving the first output asked for). On a GPU provider, inputs and outputs
        go through IO binding."""
        session = self._by_output.get(output_names[0], self._session)
        if not self._use_io_binding:
            with denormals.flushing() if self._flush_denormals else contextlib.nullcontext():
                return list(session.run(output_names, feeds))
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in output_names:
            binding.bind_output(name, self._io_device)  # allocated on the device; no host round trip
        session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())

    def close(self) -> None:
        self._session = None
        self._by_output = {}
