"""Task ``image-classification``: labels per image, as transformers' ``pipeline("image-classification")`` gives.

The model is a ``...ForImageClassification`` (ViT, DeiT, ConvNeXT, BiT...) with ``id2label`` in its
``config.json`` and its ``preprocessor_config.json``. Where the image comes from, and the limits on it, are
``engine.image`` (:mod:`sluice.engines.tasks.image_inputs`).

The result is the pipeline's: a list of ``{"label": ..., "score": ...}``, the ``top_k`` best (5 by default, at
most the number of labels), best first, equal scores in label order. ``function_to_apply`` (``softmax``,
``sigmoid``, ``none``) defaults as the pipeline's: sigmoid for multi-label models or a single label, softmax
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass, ModelIO
from sluice.engines.tasks.heads import check_num_labels, logits_output, ranked, require_head
from sluice.engines.tasks.image_inputs import (
    ImageInputs,
    ImageItem,
    ImageOptions,
    check_pixel_input,
    raise_first_failure,
)
from sluice.engines.tasks.model_config import read_model_config
from sluice.engines.tasks.task_contract import ModelRun, Task, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_classification import ScoreFunction, apply_function, default_function

PIPELINE_TOP_K = 5  # pipeline("image-classification")'s default


class ImageClassificationOptions(TaskOptions):
    image: ImageOptions = Field(default_factory=ImageOptions)
    """Where each record's image is (`source`), and the limits on it."""

    def takes_bytes(self) -> bool:
        return self.image.source == "bytes"
    top_k: int | None = Field(default=None, ge=1)
    """How many labels each result lists, best first (default 5, as transformers' pipeline)."""
    function_to_apply: ScoreFunction | None = None
    """`softmax`, `sigmoid` or `none` (default: as transformers' pipeline decides for the model)."""


class ImageClassificationTask(Task):
    name = "image-classification"
    model_class = ModelClass.IMAGE_CLASSIFICATION

    def __init__(self, options: ImageClassificationOptions, context: TaskContext) -> None:
        assert context.files.directory is not None  # an image task always has a model directory
        self.model_dir = context.files.directory
        self.model_name = self.model_dir.name
        self.config = read_model_config(self.model_dir)
        self.labels = require_head(self.config, self.model_class, self.name)
        self.function = options.function_to_apply or default_function(self.config)
        self.top_k = min(options.top_k or PIPELINE_TOP_K, len(self.labels))
        self.inputs = ImageInputs(options.image, self.model_dir, context.pipeline_dir, self.name)
        self.output = "logits"

    def bind(self, io: ModelIO) -> None:
        check_pixel_input(io.input_names, self.model_name, self.name)
        self.output = logits_output(io, self.model_name, self.name)
        check_num_labels(io, self.output, len(self.labels), self.model_name)

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return raise_first_failure(self.prepare_each(values))

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        return list(self.inputs.prepare_each(values))

    def collate(self, items: Sequence[ImageItem]) -> list[ModelRun]:
        return [ModelRun(feeds={"pixel_values": pixels}, output_names=[self.output], rows=rows)
                for rows, pixels in self.inputs.collate(items)]

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        scores = apply_function(self.function, ops.to_host(outputs[0]).astype(np.float32))  # (batch, labels)
        if scores.shape[-1] != len(self.labels):
            raise ValueError(f"the model gave {scores.shape[-1]} scores per image for {len(self.labels)} labels")
        return [ranked(self.labels, row, self.top_k) for row in scores]

    def warmup_items(self, num_items: int) -> list[Any]:
        return [self.inputs.warmup_item()] * num_items

    def records_per_poll(self) -> int | None:
        return self.inputs.records_per_poll()

    def close(self) -> None:
        self.inputs.close()

    def result_schema(self) -> dict[str, Any] | None:
        label = {"type": "object", "required": ["label", "score"],
                 "properties": {"label": {"type": "string", "enum": list(dict.fromkeys(self.labels.values()))},
                                "score": {"type": "number"}}}
        return {"type": "array", "items": label}


def _create(options: ImageClassificationOptions, context: TaskContext) -> ImageClassificationTask:
    return ImageClassificationTask(options, context)


TASK_TYPE = TaskType(name="image-classification", options=ImageClassificationOptions, create=_create,
                     model_class=ModelClass.IMAGE_CLASSIFICATION, text=False)
