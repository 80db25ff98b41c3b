"""Task ``token-classification`` (NER): entities per text, as ``pipeline("token-classification")`` gives them.

The model is a ``...ForTokenClassification`` with ``id2label`` in its ``config.json``; the tokenizer must
give character offsets (a fast tokenizer, ``tokenizer.json``). Each result is a list of entities with
``start`` / ``end`` offsets into the record's text (see :mod:`sluice.engines.tasks.token_aggregation` for
the ``aggregation_strategy`` and ``ignore_labels`` options).

Texts longer than ``max_length`` tokens (default: the model's limit, as the pipeline truncates) are
truncated: entities past the cut are not found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.tasks.heads import softmax
from sluice.engines.tasks.task_contract import ModelRun, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_inputs import TextInputs, TokenizedText
from sluice.engines.tasks.text_task import TextTask
from sluice.engines.tasks.token_aggregation import Strategy, TokenSpan, aggregate, token_spans


class TokenClassificationOptions(TaskOptions):
    max_length: int | None = Field(default=None, ge=2, le=65_536)  # truncation; default: the model's
    """Truncate inputs to this many tokens (default: the model's limit)."""
    aggregation_strategy: Strategy = "none"
    """How tokens become entities: `none`, `simple`, `first`, `average` or `max`."""
    ignore_labels: list[str] = Field(default_factory=lambda: ["O"])
    """Labels left out of the results."""


@dataclass(frozen=True, slots=True)
class TokenizedSpans:
    """One text, tokenised, with its tokens' places in the text (what post-processing needs)."""

    tokens: TokenizedText
    spans: tuple[TokenSpan, ...]

    @property
    def num_tokens(self) -> int:
        return self.tokens.num_tokens


class TokenClassificationTask(TextTask):
    name = "token-classification"
    model_class = ModelClass.TOKEN_CLASSIFICATION
    labelled = True

    def __init__(self, options: TokenClassificationOptions, context: TaskContext) -> None:
        super().__init__(context)
        self.strategy = options.aggregation_strategy
        self.ignore_labels = tuple(options.ignore_labels)
        # Only a fast tokenizer (tokenizer.json) maps tokens back to character offsets.
        self.text_tokenizer = self.tokenizer(
            options.max_length, needed_for="entities need the character offsets only a fast tokenizer gives")
        self.inputs = TextInputs(self.text_tokenizer, self.name)

    def prepare(self, values: Sequence[Any]) -> list[TokenizedSpans]:
        texts = self.inputs.texts(values)
        tokenizer = self.text_tokenizer
        items = []
        for text, encoding in zip(texts, self.inputs.encode(texts), strict=True):
            spans = token_spans(text, encoding.tokens, encoding.ids, encoding.offsets, encoding.special_tokens_mask,
                                unk_id=tokenizer.unk_id, subword_prefix=tokenizer.continuing_subword_prefix)
            items.append(TokenizedSpans(tokens=self.inputs.item(encoding), spans=tuple(spans)))
        return items

    def collate(self, items: Sequence[TokenizedSpans]) -> list[ModelRun]:
        _, feeds = self.inputs.collate([item.tokens for item in items])
        return [ModelRun(feeds=feeds, output_names=[self.output], rows=range(len(items)), state=items)]

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        logits = ops.to_host(outputs[0])  # (batch, tokens, labels)
        if logits.shape[-1] != len(self.labels):
            raise ValueError(f"the model gave {logits.shape[-1]} scores per token for {len(self.labels)} labels")
        results = []
        for item, row_logits in zip(run.state, logits, strict=True):
            scores = softmax(row_logits[: item.num_tokens])  # (tokens, labels); padding never scored
            results.append(aggregate(item.spans, scores, self.labels, self.strategy, self.text_tokenizer.decode_tokens,
                                     self.ignore_labels))
        return results


    def result_schema(self) -> dict[str, Any] | None:
        if self.strategy == "none":  # one entity per token, as HF's pipeline gives them
            label, extra = "entity", {"index": {"type": "integer"}}
        else:
            label, extra = "entity_group", {}
        properties = {label: {"type": "string"}, "score": {"type": "number"}, **extra, "word": {"type": "string"},
                      "start": {"type": "integer"}, "end": {"type": "integer"}}
        return {"type": "array", "items": {"type": "object", "required": list(properties), "properties": properties}}


def _create(options: TokenClassificationOptions, context: TaskContext) -> TokenClassificationTask:
    return TokenClassificationTask(options, context)


TASK_TYPE = TaskType(name="token-classification", options=TokenClassificationOptions, create=_create, model_class=ModelClass.TOKEN_CLASSIFICATION)
