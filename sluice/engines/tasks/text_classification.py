"""Task ``text-classification``: a label per text, as transformers' ``pipeline("text-classification")`` gives.

The model is a ``...ForSequenceClassification`` with ``id2label`` in its ``config.json``. The result is
``{"label": ..., "score": ...}`` for the best label, or with ``top_k: N`` a list of the N best, best first
(equal scores keep the label order).

``function_to_apply`` turns logits into scores: ``softmax``, ``sigmoid`` or ``none``. Its default is the
pipeline's: none for ``problem_type: regression``, sigmoid for multi-label models or a single label,
softmax otherwise.

A record is one text, or with ``inputs: {text: FIELD, text_pair: FIELD}`` (and ``codec.input_field: "."``)
a pair of fields classified together (natural-language inference, paraphrase detection).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.tasks.heads import ranked, sigmoid, softmax
from sluice.engines.tasks.model_config import (
    ModelConfig,
)
from sluice.engines.tasks.task_contract import ModelRun, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_inputs import TextInputs, pair_fields
from sluice.engines.tasks.text_task import TextTask

ScoreFunction = Literal["softmax", "sigmoid", "none"]


class TextClassificationOptions(TaskOptions):
    max_length: int | None = Field(default=None, ge=2, le=65_536)  # truncation; default: the model's
    """Truncate inputs to this many tokens (default: the model's limit)."""
    top_k: int | None = Field(default=None, ge=1)
    """Unset: the best label as `{label, score}`; N: a list of the N best, best first."""
    function_to_apply: ScoreFunction | None = None  # None: the pipeline's default for the model
    """`softmax`, `sigmoid` or `none` (default: as transformers' pipeline decides for the model)."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """Pairs: `{text: FIELD, text_pair: FIELD}` (with `codec.input_field: "."`)."""

    @model_validator(mode="after")
    def _pair(self) -> TextClassificationOptions:
        pair_fields(self.inputs, "text-classification", required=False)
        return self


def default_function(config: ModelConfig) -> ScoreFunction:
    """The score function ``pipeline("text-classification")`` picks for this model."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    if config.problem_type == "single_label_classification" or config.num_labels > 1:
        return "softmax"
    configured = config.raw.get("function_to_apply")
    return configured if configured in ("softmax", "sigmoid", "none") else "none"


def apply_function(function: ScoreFunction, logits: np.ndarray) -> np.ndarray:
    if function == "softmax":
        return softmax(logits)
    if function == "sigmoid":
        return sigmoid(logits)
    return logits


class TextClassificationTask(TextTask):
    name = "text-classification"
    model_class = ModelClass.SEQUENCE_CLASSIFICATION
    labelled = True

    def __init__(self, options: TextClassificationOptions, context: TaskContext) -> None:
        super().__init__(context)
        self.function = options.function_to_apply or default_function(self.config)
        self.top_k = options.top_k
        self.inputs = TextInputs(self.tokenizer(options.max_length), self.name, empty_pair_is_single=True,
                                 pair=pair_fields(options.inputs, self.name, required=False))

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        scores = apply_function(self.function, ops.to_host(outputs[0]))  # (batch, labels)
        if scores.shape[-1] != len(self.labels):
            raise ValueError(f"the model gave {scores.shape[-1]} scores per text for {len(self.labels)} labels")
        return [self._result(row) for row in scores]

    def result_schema(self) -> dict[str, Any] | None:
        label = {"type": "object", "required": ["label", "score"],
                 "properties": {"label": {"type": "string", "enum": list(dict.fromkeys(self.labels.values()))},
                                "score": {"type": "number"}}}
        return label if self.top_k is None else {"type": "array", "items": label}

    def _result(self, row: np.ndarray) -> Any:
        if self.top_k is None:
            best = int(row.argmax())  # the first of equal maxima, as the pipeline
            return {"label": self.labels[best], "score": float(row[best])}
        return ranked(self.labels, row, self.top_k)


def _create(options: TextClassificationOptions, context: TaskContext) -> TextClassificationTask:
    return TextClassificationTask(options, context)


TASK_TYPE = TaskType(name="text-classification", options=TextClassificationOptions, create=_create, model_class=ModelClass.SEQUENCE_CLASSIFICATION)
