"""ONNX Runtime engine (``engine: {type: onnx}``): TensorRT / CUDA / CPU execution providers.

Two tasks:

* ``text-embedding`` (default): records are strings; ``prepare`` tokenises (``tokenizer.json`` next to the
  model), ``infer`` pads the batch to its longest item, runs the model, mean-pools and normalises
  (:mod:`sluice.engines.text_embedding`). ``item_length`` is the token count, for length-aware batching.
* ``raw``: records are mappings; ``inputs`` maps each model input to a (dotted) field holding a numeric
  array. Results are ``{output_name: array}``.

The session is created and warmed up in ``start``; all start-up problems raise :class:`EngineStartError`
with one line. Providers are tried in the given order; one that this onnxruntime build lacks, or that fails
to initialise (no GPU), is skipped with a warning. On CUDA/TensorRT, outputs are bound with IO binding.
onnxruntime is imported in ``start``, never at module import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sluice.engines import onnx_providers
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
    mean_pool,
    pad_batch,
)
from sluice.engines.text_embedding import (
    result_schema as embedding_result_schema,
)

_EMBEDDING_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")  # (batch, tokens, dim): pooled here
_POOLED_OUTPUTS = ("sentence_embedding", "pooler_output_mean")  # (batch, dim): pooled in the graph
_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
                "tensor(double)": np.float64, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


class OnnxOptions(BaseModel):
    """Everything under ``engine:`` for ``type: onnx``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)  # a known model name, a .onnx file, or a directory with model.onnx
    # Tried in order; short names (cpu, cuda, tensorrt) become full onnxruntime names.
    providers: list[Annotated[str, AfterValidator(onnx_providers.full_name)]] = Field(
        default_factory=lambda: list(onnx_providers.DEFAULT_PROVIDERS), min_length=1)
    intra_op_num_threads: int | None = Field(default=None, ge=0)  # None/0: onnxruntime's default
    inter_op_num_threads: int | None = Field(default=None, ge=0)
    # onnxruntime's worker threads busy-wait between operators by default. That wins in a loop that does
    # nothing else, but here the intake (decode, tokenise) and emitter threads need the same cores.
    intra_op_spinning: bool = False
    task: Literal["text-embedding", "raw"] = "text-embedding"
    inputs: dict[str, str] = Field(default_factory=dict)  # raw task: model input name -> record field
    max_length: int = Field(default=256, ge=2, le=65_536)  # text-embedding: truncate to this many tokens
    normalize: bool = True  # text-embedding: L2-normalise the pooled vectors
    output_format: Literal["list", "base64"] = "list"  # base64: float32 little-endian bytes
    warmup: bool = True

    @model_validator(mode="after")
    def _inputs_match_task(self) -> OnnxOptions:
        if self.task == "raw" and not self.inputs:
            raise ValueError("task 'raw' needs 'inputs' (model input name -> record field)")
        if self.task == "text-embedding" and self.inputs:
            raise ValueError("'inputs' is only used with task 'raw'; text-embedding feeds the tokenised text")
        return self


class OnnxEngine(BatchEngine):
    """A batch engine over one ``onnxruntime.InferenceSession``; see the module docstring."""

    def __init__(self, options: OnnxOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._session: Any = None
        self._embedding: TextEmbeddingTask | None = None
        self._raw: RawTask | None = None
        self._output_name = ""  # text-embedding: the output used
        self._output_is_pooled = False
        self._feed_types: dict[str, Any] = {}  # model input name -> numpy dtype
        self._use_io_binding = False
        self._io_device = "cuda"
        self.providers_used: list[str] = []  # after start(): the providers the session really runs on

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        import onnxruntime as ort

        model_file = self._model_file()
        providers = onnx_providers.available_providers(ort, self.options.providers)
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.options.intra_op_num_threads is not None:
            session_options.intra_op_num_threads = self.options.intra_op_num_threads
        if not self.options.intra_op_spinning:
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.options.inter_op_num_threads is not None:
            session_options.inter_op_num_threads = self.options.inter_op_num_threads
        try:
            session = ort.InferenceSession(str(model_file), sess_options=session_options,
                                           providers=onnx_providers.with_options(
                                               providers, model_file, max_batch_size=self.context.max_batch_size,
                                               max_length=self.options.max_length,
                                               token_inputs=self.options.task == "text-embedding"))
        except Exception as err:  # onnxruntime raises its own exception types for bad files
            raise EngineStartError(f"cannot load ONNX model {model_file}: {first_line(err)}") from None
        self.providers_used = list(session.get_providers())
        onnx_providers.warn_uninitialised(providers, self.providers_used)
        self._session = session
        self._use_io_binding = self.providers_used[0] in onnx_providers.GPU_PROVIDERS
        self._feed_types = {i.name: _NUMPY_TYPES.get(i.type, np.float32) for i in session.get_inputs()}

        if self.options.task == "text-embedding":
            self._start_text_embedding(model_file)
        else:
            self._raw = RawTask(session.get_inputs(), self.options.inputs, self._feed_types,
                                [o.name for o in session.get_outputs()])
        if self.options.warmup:
            self._warm_up()

    def close(self) -> None:
        self._session = None

    def result_schema(self) -> dict[str, Any] | None:
        return embedding_result_schema(self.options.output_format) if self._embedding is not None else None

    # -------------------------------------------------------------------------------- per record

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        if self._raw is not None:
            return [self._raw.prepare(value) for value in values]
        if self._embedding is None:
            raise RuntimeError("OnnxEngine.prepare called before start()")
        return self._embedding.prepare(values)

    def item_length(self, item: Any) -> int:
        return item_length(item)

    def infer(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        if self._raw is not None:
            return self._raw.infer(items, self._run, self.options.output_format)
        return self._infer_embeddings(items)

    # ------------------------------------------------------------------------------------ internals

    def _infer_embeddings(self, items: Sequence[TokenizedText]) -> list[Any]:
        assert self._embedding is not None  # set in start(); not user input
        batch = pad_batch(items, self._embedding.pad_id)
        columns = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                   "token_type_ids": batch.token_type_ids}
        feeds = {name: columns[name].astype(dtype, copy=False) for name, dtype in self._feed_types.items()}
        (output,) = self._run(feeds, [self._output_name])
        vectors = output if self._output_is_pooled else mean_pool(output, batch.attention_mask)  # (batch, dim)
        vectors = vectors.astype(np.float32, copy=False)
        if self.options.normalize:
            vectors = l2_normalize(vectors)
        return format_vectors(vectors, self.options.output_format)

    def _run(self, feeds: dict[str, np.ndarray], output_names: list[str]) -> list[np.ndarray]:
        """One session run. On a GPU provider, inputs and outputs go through IO binding."""
        if not self._use_io_binding:
            return list(self._session.run(output_names, feeds))
        binding = self._session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in output_names:
            binding.bind_output(name, self._io_device)  # allocated on the device; no host round trip
        self._session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())

    def _model_file(self) -> Path:
        from sluice.models import ModelError, resolve_model_file

        try:
            return resolve_model_file(self.options.model, "model.onnx", base_dir=self.context.pipeline_dir)
        except ModelError as err:
            raise EngineStartError(str(err)) from None

    def _start_text_embedding(self, model_file: Path) -> None:
        inputs = list(self._feed_types)
        unexpected = [name for name in inputs if name not in _EMBEDDING_INPUTS]
        if unexpected or "input_ids" not in inputs:
            raise EngineStartError(f"model {model_file.name} takes inputs {inputs}; the text-embedding task feeds "
                                   f"{list(_EMBEDDING_INPUTS)} (use task: raw with 'inputs' for other models)")
        outputs = {o.name: o for o in self._session.get_outputs()}
        token_level = [n for n in _TOKEN_OUTPUTS if n in outputs]
        pooled = [n for n in _POOLED_OUTPUTS if n in outputs]
        if token_level:
            self._output_name, self._output_is_pooled = token_level[0], False
        elif pooled:
            self._output_name, self._output_is_pooled = pooled[0], True
        else:
            raise EngineStartError(f"model {model_file.name} has outputs {list(outputs)}; the text-embedding task "
                                   f"needs one of {list(_TOKEN_OUTPUTS + _POOLED_OUTPUTS)}")
        self._embedding = load_task(model_file.parent, self.options.max_length)

    def _warm_up(self) -> None:
        """Run the model once at batch 1 and once at the largest batch, so the first records pay no setup."""
        num_large = max(1, min(self.context.max_batch_size, 64))
        try:
            if self._embedding is not None:
                for size in sorted({1, num_large}):
                    self._infer_embeddings(self._embedding.tokenize(["warm-up run"] * size))
            elif self._raw is not None:
                self._raw.warm_up(self._run)
        except Exception as err:
            raise EngineStartError(f"warm-up run of the model failed: {first_line(err)}") from None


def _make(options: OnnxOptions, context: EngineContext) -> OnnxEngine:
    return OnnxEngine(options, context)


ENGINE_TYPE = EngineType(name="onnx", options=OnnxOptions, factory=_make)
