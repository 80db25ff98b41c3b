"""What the text tasks share: the model directory's configs, the tokenised inputs, one run per batch.

A subclass sets ``self.inputs`` (:class:`sluice.engines.tasks.text_inputs.TextInputs`) and the output it
reads in ``bind``, and writes ``postprocess``; tokenising, lengths, collating and warm-up inputs are here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from sluice.engines.backends.backend_contract import ModelIO
from sluice.engines.tasks.heads import check_num_labels, logits_output, require_head
from sluice.engines.tasks.model_config import default_max_length, read_model_config, read_tokenizer_config
from sluice.engines.tasks.task_contract import ModelRun, Task, TaskContext
from sluice.engines.tasks.text_inputs import TextInputs
from sluice.engines.tasks.tokenizer import TextTokenizer


class TextTask(Task):
    """A task whose records are texts (or text pairs) tokenised with the model's tokenizer."""

    inputs: TextInputs
    model_dir: Path  # always set: a text task reads its model directory
    labelled: ClassVar[bool] = False  # True: the model must have the task's head and id2label (classifiers)

    def __init__(self, context: TaskContext) -> None:
        assert context.files.directory is not None  # text tasks always have a model directory
        self.model_dir = self.transformer_dir(context)
        self.model_name = self.model_dir.name
        self.config = read_model_config(self.model_dir)
        self.tokenizer_config = read_tokenizer_config(self.model_dir)
        self.labels = require_head(self.config, self.model_class, self.name) if self.labelled else {}
        self.output = ""  # the model output postprocess reads; chosen in bind

    def tokenizer(self, max_length: int | None, **options: Any) -> TextTokenizer:
        """The model's tokenizer truncating at ``max_length`` (default: the model's limit); sets max_tokens."""
        self.max_tokens = max_length or default_max_length(self.config, self.tokenizer_config)
        return TextTokenizer(self.model_dir, self.max_tokens, self.config, self.tokenizer_config, task=self.name,
                             **options)

    def transformer_dir(self, context: TaskContext) -> Path:
        """The directory of the Hugging Face model (the pipeline's model directory, by default)."""
        assert context.files.directory is not None
        return context.files.directory

    def bind(self, io: ModelIO) -> None:
        self.inputs.bind(io, self.model_name)
        self.output = self.choose_output(io)

    def choose_output(self, io: ModelIO) -> str:
        """The output to read (default: the logits, one score per label); EngineStartError when none fits."""
        output = logits_output(io, self.model_name, self.name)
        if self.labelled:
            check_num_labels(io, output, len(self.labels), self.model_name)
        return output

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return self.inputs.prepare(values)

    def item_length(self, item: Any) -> int:
        return int(item.num_tokens)

    def collate(self, items: Sequence[Any]) -> list[ModelRun]:
        _, feeds = self.inputs.collate(items)
        return [ModelRun(feeds=feeds, output_names=[self.output], rows=range(len(items)))]

    def warmup_items(self, num_items: int) -> list[Any]:
        return self.prepare(self.inputs.warmup_values(num_items))
