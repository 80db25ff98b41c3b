"""Task ``text-embedding``: one vector per text, as ``SentenceTransformer.encode`` computes it.

From the model directory (:mod:`sluice.engines.tasks.sentence_model`): the pooling (``modules.json``,
``1_Pooling/config.json``), any Dense and Normalize modules, the named prompts and the truncation length.
Options override them:

* ``pooling``: one mode or a list (:data:`sluice.engines.tasks.pooling.POOLING_MODES`).
* ``normalize``: ``true`` / ``false``; default: as the model says (its Normalize module), and ``true`` for a
  directory without sentence-transformers files.
* ``prompt_name`` (a prompt of ``config_sentence_transformers.json``) or ``prompt`` (text): prepended to
  every text. The model's ``default_prompt_name`` applies when neither is given, as in sentence-transformers.
  With ``include_prompt: false`` in the pooling config, prompt tokens do not count in the pooling.
* ``dimensions``: keep the first N values (Matryoshka models), then normalise again when normalising.
* ``output_format``: ``list`` of floats or ``base64`` float32 bytes.

The pooler runs where the model's outputs are (the GPU for torch and TensorRT); only the vectors come back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass, ModelIO
from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tasks.pooling import pool
from sluice.engines.tasks.sentence_model import Dense, SentenceModel, read_sentence_model, transformer_dir
from sluice.engines.tasks.task_contract import ModelRun, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_inputs import TextInputs, TokenizedText
from sluice.engines.tasks.text_task import TextTask
from sluice.engines.tasks.vector_formats import OutputFormat, format_vectors, l2_normalize

PoolingName = Literal["mean", "cls", "max", "last-token", "weighted-mean", "mean-sqrt-len"]
TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")  # (batch, tokens, dim): pooled here
POOLED_OUTPUTS = ("sentence_embedding", "pooler_output_mean")  # (batch, dim): pooled in the graph


class TextEmbeddingOptions(TaskOptions):
    max_length: int | None = Field(default=None, ge=2, le=65_536)  # truncation; default: the model's
    """Truncate inputs to this many tokens (default: the model's limit)."""
    pooling: PoolingName | list[PoolingName] | None = None  # default: the model's pooling config
    """`mean`, `cls`, `max`, `last-token`, `weighted-mean`, `mean-sqrt-len`, or a list (default: the model's
    pooling config)."""
    normalize: bool | None = None  # default: the model's Normalize module (true without modules.json)
    """Scale vectors to unit length (default: as the model's sentence-transformers modules say; `true` without
    them)."""
    prompt_name: str | None = Field(default=None, min_length=1)
    """A prompt of the model's sentence-transformers config (`query`, `passage`...) put before each text."""
    prompt: str | None = None
    """A prompt put before each text."""
    dimensions: int | None = Field(default=None, ge=1)
    """Keep the first N dimensions (Matryoshka models)."""
    output_format: OutputFormat = "list"
    """`list` of floats, or `base64` of little-endian float32."""

    @model_validator(mode="after")
    def _one_prompt(self) -> TextEmbeddingOptions:
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("give 'prompt' (the text) or 'prompt_name' (a prompt of the model), not both")
        if isinstance(self.pooling, list) and not self.pooling:
            raise ValueError("'pooling' needs at least one mode")
        return self


class TextEmbeddingTask(TextTask):
    name = "text-embedding"
    model_class = ModelClass.ENCODER

    def __init__(self, options: TextEmbeddingOptions, context: TaskContext) -> None:
        assert context.files.directory is not None  # text tasks always have a model directory
        sentence = read_sentence_model(context.files.directory)
        self._sentence = sentence
        super().__init__(context)
        prompt = _prompt(options, sentence)
        tokenizer = self.tokenizer(options.max_length or sentence.max_seq_length, lowercase=sentence.do_lower_case)
        self.inputs = TextInputs(tokenizer, self.name, prefix=prompt)
        given = options.pooling
        self.pooling_modes = tuple([given] if isinstance(given, str) else given) if given else sentence.pooling.modes
        # sentence-transformers' prompt length: the prompt's tokens, without a trailing special token.
        self.prompt_tokens = 0
        if prompt and not sentence.pooling.include_prompt:
            (ids,) = [encoding.ids for encoding in tokenizer.encode([prompt])]
            self.prompt_tokens = len(ids) - (1 if ids and ids[-1] in tokenizer.special_ids else 0)
        self.steps = _steps(sentence, options.normalize)
        self.normalized = bool(self.steps) and self.steps[-1] == "normalize"
        self.dimensions = options.dimensions
        self.output_format = options.output_format
        self._output_is_pooled = False

    def transformer_dir(self, context: TaskContext) -> Path:
        return self._sentence.transformer_dir

    def choose_output(self, io: ModelIO) -> str:
        outputs = io.output_names
        token_level = [n for n in TOKEN_OUTPUTS if n in outputs]
        pooled = [n for n in POOLED_OUTPUTS if n in outputs]
        if not token_level and not pooled:
            raise EngineStartError(f"model {self.model_name} has outputs {outputs}; task text-embedding needs one "
                                   f"of {list(TOKEN_OUTPUTS + POOLED_OUTPUTS)}")
        self._output_is_pooled = not token_level
        return (token_level or pooled)[0]

    def collate(self, items: Sequence[TokenizedText]) -> list[ModelRun]:
        batch, feeds = self.inputs.collate(items)
        mask = batch.attention_mask  # (batch, tokens)
        if self.prompt_tokens:
            mask = mask.copy()
            mask[:, : self.prompt_tokens] = 0  # the prompt does not count in the pooling
        return [ModelRun(feeds=feeds, output_names=[self.output], rows=range(len(items)), state=mask)]

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        (output,) = outputs
        if self._output_is_pooled:
            vectors = ops.to_host(output)  # (batch, dim)
        else:
            mask = ops.from_host("pooling_mask", run.state)  # its own buffer: the feeds' may still be in flight
            vectors = ops.to_host(pool(ops, output, mask, self.pooling_modes))  # (batch, dim)
        for step in self.steps:
            vectors = l2_normalize(vectors) if isinstance(step, str) else step(vectors)
        if self.dimensions is not None:
            if self.dimensions > vectors.shape[1]:
                raise ValueError(f"dimensions: {self.dimensions} is more than the model's {vectors.shape[1]}")
            vectors = vectors[:, : self.dimensions]
            if self.normalized:
                vectors = l2_normalize(vectors)
        return format_vectors(vectors, self.output_format)

    def result_schema(self) -> dict[str, Any] | None:
        return _vector_schema(self.output_format)


def _vector_schema(output_format: OutputFormat) -> dict[str, Any]:
    """JSON Schema of one result of :func:`format_vectors` (``format: float``: 32-bit values)."""
    if output_format == "list":
        return {"type": "array", "items": {"type": "number", "format": "float"}}
    return {"type": "string", "contentEncoding": "base64"}


def _prompt(options: TextEmbeddingOptions, sentence: SentenceModel) -> str:
    if options.prompt is not None:
        return options.prompt
    name = options.prompt_name or sentence.default_prompt_name
    if name is None:
        return ""
    if name not in sentence.prompts:
        known = ", ".join(sorted(sentence.prompts)) or "none"
        raise EngineStartError(f"task text-embedding: prompt_name {name!r} is not a prompt of the model "
                               f"(config_sentence_transformers.json has: {known})")
    return sentence.prompts[name]


def _steps(sentence: SentenceModel, normalize: bool | None) -> tuple[Dense | str, ...]:
    """The modules after pooling, with ``normalize`` applied: None keeps the model's own choice."""
    steps = list(sentence.steps)
    if normalize is None:
        normalize = sentence.normalizes if sentence.has_modules else True
    if not normalize:
        return tuple(step for step in steps if step != "normalize")
    if not steps or steps[-1] != "normalize":
        steps.append("normalize")
    return tuple(steps)


def _create(options: TextEmbeddingOptions, context: TaskContext) -> TextEmbeddingTask:
    return TextEmbeddingTask(options, context)


TASK_TYPE = TaskType(name="text-embedding", options=TextEmbeddingOptions, create=_create,
                     model_class=ModelClass.ENCODER, model_dir=transformer_dir)
