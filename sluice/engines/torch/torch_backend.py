"""PyTorch backend: a Hugging Face model directory loaded with the task's head, or an in-code module.

* ``model``: a known model name or a Hugging Face directory (``config.json`` + safetensors), loaded offline
  with the auto class of the task's head (:func:`sluice.engines.torch.text_graphs.load_hf_model`). Called with
  keyword tensors (``input_ids``, ``attention_mask``, and ``token_type_ids`` where the model has segments);
  outputs are read by name. An image model (:mod:`sluice.engines.torch.vision_graphs`) runs as its graphs: a
  batch goes to the graph giving the first output asked for, its inputs passed in the graph's order.
* ``factory`` / ``torchscript`` / ``exported`` (task raw): called with one positional tensor per entry of
  ``inputs``, in that order; ``input_shapes`` / ``input_dtypes`` declare them, ``outputs`` names the results
  (a tensor, a tuple/list in that order, or a dict holding those keys).

``run`` returns tensors where the module left them (the GPU): the task reduces them there
(:class:`sluice.engines.backends.arrays.TorchOps`). Batches run under ``torch.inference_mode``; on CUDA
inputs go through pinned host buffers with non-blocking copies.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.arrays import TorchOps
from sluice.engines.backends.backend_contract import (
    Backend,
    LoadRequest,
    ModelClass,
    ModelFiles,
    ModelIO,
    TensorSpec,
)
from sluice.engines.engine_contract import EngineContext, EngineStartError
from sluice.engines.tasks.text_inputs import TEXT_INPUTS
from sluice.engines.torch import placement, text_graphs

_NUMPY_TYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


class TorchBackend(Backend):
    """See the module docstring. ``options`` is the engine's TorchOptions."""

    def __init__(self, options: Any, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._torch: Any = None
        self._module: Any = None
        self._staging: placement.HostStaging | None = None
        self._keyword = False  # True for Hugging Face models (keyword inputs, named outputs)
        self._input_order: list[str] = []  # positional order for in-code modules
        self._graphs: dict[str, Any] = {}  # image models: output name -> vision_graphs.Graph
        self.device: Any = None  # after open(): the torch.device the module runs on
        self.dtype: Any = None  # after open(): the compute dtype

    def model_reference(self) -> str | None:
        o = self.options
        return o.model or o.torchscript or o.exported  # None: a factory builds the module in code

    def locate(self) -> ModelFiles:
        options = self.options
        if options.model is not None:
            model_dir = self._path(options.model)
            if not model_dir.is_dir():
                raise EngineStartError(f"engine torch: 'model' must be a known model name or a Hugging Face model "
                                       f"directory; {model_dir} is a file")
            return ModelFiles(directory=model_dir, model_path=model_dir)
        path = options.torchscript or options.exported
        return ModelFiles(directory=None, model_path=self._path(path) if path is not None else None)

    def open(self, request: LoadRequest) -> ModelIO:
        try:
            import torch
        except ImportError:
            raise EngineStartError("engine torch: the 'torch' package is not installed "
                                   "(pip install 'sluice[torch]')") from None
        self._torch = torch
        self.device = placement.resolve_device(torch, self.options.device, "torch")
        self.dtype = placement.resolve_dtype(torch, self.options.dtype, self.device, "torch")
        if self.options.model is not None:
            module, io = self._load_hf(request)
        else:
            module, io = self._load_in_code(), self._declared_io()
        if self.options.exported is None:
            module = module.to(device=self.device, dtype=self.dtype)
        if self.options.compile:
            module = torch.compile(module, dynamic=True)
            self._graphs = {name: replace(graph, module=torch.compile(graph.module, dynamic=True))
                            for name, graph in self._graphs.items()}
        self._module = module
        self._staging = placement.HostStaging(torch, self.device)
        self.ops = TorchOps(torch, self.device, self._staging)
        return io

    def inference(self) -> AbstractContextManager[Any]:
        return self._torch.inference_mode()  # type: ignore[no-any-return]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        assert self._staging is not None  # set in open(); not user input
        if self._graphs:
            graph = self._graphs[output_names[0]]
            return [graph.module(*self._positional(graph.inputs, feeds))]
        if self._keyword:
            tensors = {name: self._staging.to_device(name, array) for name, array in feeds.items()}
            returned = self._module(**tensors)
            return [returned[name] for name in output_names]
        return self._outputs(self._module(*self._positional(self._input_order, feeds)), output_names)

    def _positional(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """The feeds named ``names``, in that order, on the device (floats in the compute dtype)."""
        assert self._staging is not None
        args = []
        for name in names:
            array = feeds[name]
            floating = np.issubdtype(array.dtype, np.floating)
            args.append(self._staging.to_device(name, array, self.dtype if floating else None))
        return args

    def close(self) -> None:
        self._module = None
        self._graphs = {}  # image models' graphs hold the model too
        self._staging = None
        if self._torch is not None and self.device is not None and self.device.type == "cuda":
            self._torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------ internals

    def _load_hf(self, request: LoadRequest) -> tuple[Any, ModelIO]:
        if request.model_class is ModelClass.ANY or request.model_dir is None:
            raise EngineStartError("engine torch: task raw runs a factory, torchscript or exported module")
        model = text_graphs.load_hf_model(request.model_dir, request.model_class,
                                           trust_remote_code=request.trust_remote_code)
        if request.model_class.images:
            return model, self._image_graphs(model, request.model_class, request.model_dir)
        accepted = set(inspect.signature(model.forward).parameters)
        # Segment ids only where the model has segments to tell apart (BERT: 2; RoBERTa-style: 1).
        segments = int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
        names = [n for n in TEXT_INPUTS if n in accepted and (n != "token_type_ids" or segments)]
        self._keyword = True
        inputs = tuple(TensorSpec(name=n, dtype=np.int64, shape=(None, None)) for n in names)
        return model, ModelIO(inputs=inputs, outputs=(TensorSpec(request.model_class.output_name, np.float32, ()),))

    def _image_graphs(self, model: Any, model_class: ModelClass, model_dir: Path) -> ModelIO:
        from sluice.engines.torch import vision_graphs

        graphs = vision_graphs.graphs(model, model_class, model_dir)
        self._graphs = {graph.output: graph for graph in graphs}  # they share the model's weights, moved in open()
        inputs = {name: TensorSpec(name, np.float32 if name == "pixel_values" else np.int64,
                                   (None, 3, None, None) if name == "pixel_values" else (None, None))
                  for graph in graphs for name in graph.inputs}
        return ModelIO(inputs=tuple(inputs.values()),
                       outputs=tuple(TensorSpec(graph.output, np.float32, ()) for graph in graphs))

    def _load_in_code(self) -> Any:
        options = self.options
        if options.factory is not None:
            return text_graphs.load_factory(options.factory, dict(options.factory_kwargs))
        if options.torchscript is not None:
            return text_graphs.load_torchscript(self._path(options.torchscript))
        if self.dtype != self._torch.float32:
            raise EngineStartError("engine torch: an exported program runs in the dtype it was exported "
                                   "with; set dtype: float32")
        return text_graphs.load_exported(self._path(options.exported), self.device)

    def _declared_io(self) -> ModelIO:
        """The raw task's inputs as the pipeline declares them (a module carries no signature we can trust)."""
        options = self.options
        self._input_order = list(options.inputs)
        inputs = tuple(TensorSpec(name=name, dtype=_NUMPY_TYPES[options.input_dtypes.get(name, "float32")],
                                  shape=(None, *options.input_shapes.get(name, [None])))
                       for name in options.inputs)
        return ModelIO(inputs=inputs, outputs=tuple(TensorSpec(n, np.float32, ()) for n in options.outputs))

    def _outputs(self, returned: Any, output_names: Sequence[str]) -> list[Any]:
        """A module's return value -> one tensor per output name."""
        if isinstance(returned, dict):
            missing = [n for n in output_names if n not in returned]
            if missing:
                raise ValueError(f"the module returned keys {sorted(returned)}; 'outputs' names {missing}")
            tensors = [returned[n] for n in output_names]
        else:
            tensors = list(returned) if isinstance(returned, (tuple, list)) else [returned]
            if len(tensors) != len(output_names):
                raise ValueError(f"the module returned {len(tensors)} output(s); 'outputs' names "
                                 f"{len(output_names)}: {list(output_names)}")
        for tensor in tensors:
            if not isinstance(tensor, self._torch.Tensor):
                raise ValueError(f"the module returned a {type(tensor).__name__}, not a tensor")
        return tensors

    def _path(self, name_or_path: str) -> Path:
        from sluice.model_store import ModelError, resolve_model

        try:
            return resolve_model(name_or_path, base_dir=self.context.pipeline_dir)
        except ModelError as err:
            raise EngineStartError(str(err)) from None
