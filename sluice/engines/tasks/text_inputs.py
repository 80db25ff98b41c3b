"""Record values to tokenised items, and items to padded model feeds: shared by every text task.

* :class:`TextInputs` (intake thread): a record value is one text (a string, or UTF-8 bytes) or, with
  ``inputs: {text: FIELD, text_pair: FIELD}``, a pair of record fields; it becomes a :class:`TokenizedText`
  whose length (both texts of a pair, special tokens included) is what length bucketing and token budgets
  count.
* :func:`pad_batch` / :meth:`TextInputs.feeds` (engine thread): right-pad a batch to its longest item and
  give the model exactly the inputs it declares, in the dtypes it declares.

Numpy only; the tokenizer is :class:`sluice.engines.tasks.tokenizer.TextTokenizer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.engines.backends.backend_contract import ModelIO
from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.engines.tasks.record_fields import as_text, lookup
from sluice.engines.tasks.tokenizer import TextTokenizer

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True, slots=True)
class TokenizedText:
    """One record's text (or text pair), tokenised: what ``prepare`` hands the batcher."""

    ids: np.ndarray  # (num_tokens,) int64, special tokens included, truncated to max_length
    num_tokens: int  # every token of ``ids`` is attended to
    type_ids: np.ndarray | None = None  # (num_tokens,) int64 segment ids; None: all 0 (a single text)


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """A batch padded to its longest item (right padding with the pad id)."""

    input_ids: np.ndarray  # (batch, max_tokens) int64
    attention_mask: np.ndarray  # (batch, max_tokens) int64, 1 on real tokens, 0 on padding
    token_type_ids: np.ndarray  # (batch, max_tokens) int64, 0 on padding


def pad_batch(items: Sequence[TokenizedText], pad_id: int = 0) -> PaddedBatch:
    """Right-pad ``items`` to the longest one. ``items`` must not be empty."""
    max_tokens = max(item.num_tokens for item in items)
    input_ids = np.full((len(items), max_tokens), pad_id, dtype=np.int64)  # (batch, max_tokens)
    attention_mask = np.zeros((len(items), max_tokens), dtype=np.int64)  # (batch, max_tokens)
    token_type_ids = np.zeros((len(items), max_tokens), dtype=np.int64)  # (batch, max_tokens)
    for row, item in enumerate(items):
        input_ids[row, : item.num_tokens] = item.ids
        attention_mask[row, : item.num_tokens] = 1
        if item.type_ids is not None:
            token_type_ids[row, : item.num_tokens] = item.type_ids
    return PaddedBatch(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def pair_fields(inputs: Mapping[str, str], task: str, *, required: bool) -> tuple[str, str] | None:
    """``inputs: {text: FIELD, text_pair: FIELD}`` as (text field, pair field); None when not given.

    Raises ValueError (an options error) for other keys, or when ``required`` and not given.
    """
    if not inputs:
        if required:
            raise ValueError(f"task {task} needs 'inputs: {{text: FIELD, text_pair: FIELD}}' (two record "
                             "fields, with codec.input_field: \".\")")
        return None
    if sorted(inputs) != ["text", "text_pair"]:
        raise ValueError(f"task {task}: 'inputs' takes exactly the keys text and text_pair (record fields), "
                         f"got {sorted(inputs)}")
    return inputs["text"], inputs["text_pair"]


class TextInputs:
    """Record values -> :class:`TokenizedText` for one tokenizer; batches -> model feeds."""

    def __init__(self, tokenizer: TextTokenizer, task: str, *, pair: tuple[str, str] | None = None,
                 prefix: str = "", empty_pair_is_single: bool = False) -> None:
        self.tokenizer = tokenizer
        self.task = task
        self.pair = pair  # (text field, pair field) of a record, or None for one text per record
        self.prefix = prefix  # prepended to every text (an embedding prompt)
        # transformers' tokenizer(text, text_pair="") encodes the text alone (an empty pair is no pair) when
        # called with one input, as the text-classification pipeline calls it; in batches (CrossEncoder)
        # the empty text is a second segment of its own.
        self.empty_pair_is_single = empty_pair_is_single
        self._feed_types: dict[str, Any] = {}  # model input name -> numpy dtype; set by bind

    # ------------------------------------------------------------------------------------ intake thread

    def texts(self, values: Sequence[Any]) -> list[Any]:
        """Record values as texts (prefix applied) or (text, text_pair) tuples. RecordError if malformed."""
        if self.pair is None:
            if self.prefix:
                return [self.prefix + as_text(value, self.task) for value in values]
            return [as_text(value, self.task) for value in values]
        text_field, pair_field = self.pair
        pairs = []
        for value in values:
            if not isinstance(value, Mapping):
                raise RecordError(f"task {self.task} reads the fields {text_field!r} and {pair_field!r} of a JSON "
                                  f"object (codec.input_field: \".\"), got {type(value).__name__}")
            text = as_text(lookup(value, text_field), self.task, text_field)
            text_pair = as_text(lookup(value, pair_field), self.task, pair_field)
            pairs.append(text if self.empty_pair_is_single and not text_pair else (text, text_pair))
        return pairs

    def encode(self, texts: Sequence[Any]) -> list[Any]:
        """``tokenizers.Encoding`` per text (or pair) of :meth:`texts`."""
        if self.pair is None:
            return self.tokenizer.encode(texts)
        return self.tokenizer.encode_pairs(texts)

    def item(self, encoding: Any) -> TokenizedText:
        ids = np.asarray(encoding.ids, dtype=np.int64)
        # Single texts are one segment (all 0); only pairs carry segment ids.
        type_ids = np.asarray(encoding.type_ids, dtype=np.int64) if self.pair is not None else None
        return TokenizedText(ids=ids, num_tokens=int(ids.shape[0]), type_ids=type_ids)

    def prepare(self, values: Sequence[Any]) -> list[TokenizedText]:
        return [self.item(encoding) for encoding in self.encode(self.texts(values))]

    def warmup_values(self, num_values: int) -> list[Any]:
        if self.pair is None:
            return ["warm-up run"] * num_values
        text_field, pair_field = self.pair
        record: dict[str, Any] = {}
        for field, text in ((text_field, "warm-up query"), (pair_field, "a warm-up passage to score")):
            node = record
            *parents, last = field.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = text
        return [record] * num_values

    # ------------------------------------------------------------------------------------ engine thread

    def bind(self, io: ModelIO, model_name: str) -> None:
        """Check the model takes (a subset of) the text inputs; remember the dtypes it wants."""
        inputs = io.input_names
        unexpected = [name for name in inputs if name not in TEXT_INPUTS]
        if unexpected or "input_ids" not in inputs:
            raise EngineStartError(f"model {model_name} takes inputs {inputs}; task {self.task} feeds "
                                   f"{list(TEXT_INPUTS)} (use task: raw with 'inputs' for other models)")
        self._feed_types = {spec.name: spec.dtype for spec in io.inputs}

    def feeds(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        columns = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                   "token_type_ids": batch.token_type_ids}
        return {name: columns[name].astype(dtype, copy=False) for name, dtype in self._feed_types.items()}

    def collate(self, items: Sequence[TokenizedText]) -> tuple[PaddedBatch, dict[str, np.ndarray]]:
        batch = pad_batch(items, self.tokenizer.pad_id)
        return batch, self.feeds(batch)
