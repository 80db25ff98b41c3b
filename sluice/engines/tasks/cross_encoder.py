"""Task ``cross-encoder``: a relevance score per (text, text_pair), as sentence-transformers' ``CrossEncoder``.

A record holds both texts: ``inputs: {text: FIELD, text_pair: FIELD}`` with ``codec.input_field: "."``.
They are tokenised together (``[CLS] text [SEP] text_pair [SEP]`` with segment ids 0 / 1 for BERT-style
models; ``longest_first`` truncation at ``max_length`` trims the longer text first), and the length both
texts take is what length bucketing and token budgets count.

The score is ``CrossEncoder.predict``'s: the model's logits through its activation -- the one saved with the
model (``config_sentence_transformers.json`` or ``config.json``'s ``sentence_transformers.activation_fn``),
else sigmoid for a single-score model and none for several. ``activation`` overrides it. One score gives a
number, several a list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tasks.heads import require_architecture, sigmoid, softmax
from sluice.engines.tasks.model_config import (
    ModelConfig,
    read_json,
    sentence_bert_config,
)
from sluice.engines.tasks.task_contract import ModelRun, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_inputs import TextInputs, pair_fields
from sluice.engines.tasks.text_task import TextTask

Activation = Literal["sigmoid", "softmax", "tanh", "none"]
# torch activation class names sentence-transformers saves -> ours
_SAVED_ACTIVATIONS: dict[str, Activation] = {"Sigmoid": "sigmoid", "Identity": "none", "Tanh": "tanh",
                                             "Softmax": "softmax"}


class CrossEncoderOptions(TaskOptions):
    max_length: int | None = Field(default=None, ge=2, le=65_536)  # both texts together; default: the model's
    """Truncate each pair, both texts together, to this many tokens (default: the model's limit)."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """The two texts: `{text: FIELD, text_pair: FIELD}` (required; with `codec.input_field: "."`)."""
    activation: Activation | None = None  # None: the model's saved activation, else CrossEncoder's default
    """Applied to the scores (default: the model's saved activation, else sentence-transformers' default)."""

    @model_validator(mode="after")
    def _pair(self) -> CrossEncoderOptions:
        pair_fields(self.inputs, "cross-encoder", required=True)
        return self


def saved_activation(directory: Path, config: ModelConfig) -> Activation:
    """The activation ``CrossEncoder(directory)`` applies in ``predict``."""
    saved = (read_json(directory / "config_sentence_transformers.json").get("activation_fn")
             or config.sentence_transformers.get("activation_fn")
             or config.raw.get("sbert_ce_default_activation_function"))
    if saved:
        name = str(saved).rsplit(".", 1)[-1]
        if name not in _SAVED_ACTIVATIONS or not str(saved).startswith("torch."):
            raise EngineStartError(f"task cross-encoder: the model's activation {saved!r} is not one this task "
                                   f"applies; set 'activation' to one of {sorted(set(_SAVED_ACTIVATIONS.values()))}")
        return _SAVED_ACTIVATIONS[name]
    return "sigmoid" if (config.num_labels or 2) == 1 else "none"


def _check_modules(directory: Path) -> None:
    modules = directory / "modules.json"
    if not modules.is_file():
        return
    try:
        listed = json.loads(modules.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EngineStartError(f"cannot read {modules}: {err}") from None
    extra = [str(m.get("type")) for m in listed[1:]] if isinstance(listed, list) else ["?"]
    if extra:
        raise EngineStartError(f"task cross-encoder: {modules} lists modules after the transformer ({extra}); "
                               "this task scores with the transformer's classification head alone")


class CrossEncoderTask(TextTask):
    name = "cross-encoder"
    model_class = ModelClass.SEQUENCE_CLASSIFICATION

    def __init__(self, options: CrossEncoderOptions, context: TaskContext) -> None:
        super().__init__(context)
        require_architecture(self.config, self.model_class, self.name)
        _check_modules(self.model_dir)
        self.activation = options.activation or saved_activation(self.model_dir, self.config)
        saved_length = sentence_bert_config(self.model_dir).get("max_seq_length")
        max_length = options.max_length or (saved_length if isinstance(saved_length, int) else None)
        self.inputs = TextInputs(self.tokenizer(max_length), self.name,
                                 pair=pair_fields(options.inputs, self.name, required=True))

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        logits = ops.to_host(outputs[0])  # (batch, num_scores)
        scores = _activate(self.activation, logits)
        if scores.shape[-1] == 1:
            return [float(score) for score in scores[:, 0]]
        return [row.tolist() for row in scores]


    def result_schema(self) -> dict[str, Any] | None:
        score = {"type": "number"}
        return score if (self.config.num_labels or 1) == 1 else {"type": "array", "items": score}


def _activate(activation: Activation, logits: np.ndarray) -> np.ndarray:
    if activation == "sigmoid":
        return sigmoid(logits)
    if activation == "softmax":
        return softmax(logits)
    if activation == "tanh":
        return np.tanh(logits).astype(np.float32, copy=False)
    return logits


def _create(options: CrossEncoderOptions, context: TaskContext) -> CrossEncoderTask:
    return CrossEncoderTask(options, context)


TASK_TYPE = TaskType(name="cross-encoder", options=CrossEncoderOptions, create=_create, model_class=ModelClass.SEQUENCE_CLASSIFICATION)
