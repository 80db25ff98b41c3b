"""The text-embedding task, shared by every engine that embeds text (ONNX now; torch and TensorRT later).

The work splits along the engine contract:

* ``prepare`` (intake thread): :meth:`TextEmbeddingTask.tokenize` turns each text into a
  :class:`TokenizedText` -- ids truncated to ``max_length``, no padding.
* ``infer`` (engine thread): :func:`pad_batch` pads a batch to its longest item, the engine runs the model,
  then :func:`mean_pool`, :func:`l2_normalize` and :func:`format_vectors` turn hidden states into results.

Numpy only: no inference runtime is imported here. ``tokenizers`` is imported when a tokenizer is loaded.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sluice.engines.base import EngineStartError, RecordError, first_line

OutputFormat = Literal["list", "base64"]


@dataclass(frozen=True, slots=True)
class TokenizedText:
    """One text, tokenised: what ``prepare`` hands the batcher and ``infer`` receives back."""

    ids: np.ndarray  # (num_tokens,) int64, special tokens included, truncated to max_length
    num_tokens: int  # attention length: every token of ``ids`` is attended to


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """A batch padded to its longest item (right padding with the pad id)."""

    input_ids: np.ndarray  # (batch, max_tokens) int64
    attention_mask: np.ndarray  # (batch, max_tokens) int64, 1 on real tokens, 0 on padding
    token_type_ids: np.ndarray  # (batch, max_tokens) int64, all 0 (single-segment inputs)


class TextEmbeddingTask:
    """Tokeniser settings for one model: ``tokenizer.json`` loaded with truncation and without padding.

    ``tokenize`` may be called from one thread while ``infer`` of the engine runs on another: the tokenizer
    is only used here.
    """

    def __init__(self, tokenizer_path: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # tokenizer.json files often carry fixed padding/truncation from training; padding happens per batch
        # (to the longest item) in pad_batch, and truncation follows the pipeline's max_length.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer = tokenizer
        self.max_length = max_length
        padding_id = tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if padding_id is None else padding_id

    def prepare(self, values: Sequence[Any]) -> list[TokenizedText]:
        """An engine's ``prepare`` for this task: record values (str or UTF-8 bytes) -> tokenised items."""
        return self.tokenize([as_text(value) for value in values])

    def tokenize(self, texts: Sequence[str]) -> list[TokenizedText]:
        """Tokenise ``texts`` (already checked to be strings); one item per text, in order."""
        if len(texts) == 1:
            encodings = [self._tokenizer.encode(texts[0])]
        else:
            encodings = self._tokenizer.encode_batch(list(texts))  # parallel, releases the GIL
        items = []
        for encoding in encodings:
            ids = np.asarray(encoding.ids, dtype=np.int64)
            items.append(TokenizedText(ids=ids, num_tokens=int(ids.shape[0])))
        return items


def check_pooling_config(model_dir: Path) -> None:
    """Raise ValueError when the model's sentence-transformers pooling config asks for other than mean pooling.

    ``1_Pooling/config.json`` (when present) says how the model was trained to pool; embeddings pooled any
    other way would be silently wrong, so this task refuses such models instead.
    """
    config_path = model_dir / "1_Pooling" / "config.json"
    if not config_path.is_file():
        return  # no sentence-transformers metadata: mean pooling is the documented behaviour
    config = json.loads(config_path.read_text(encoding="utf-8"))
    modes = sorted(key.removeprefix("pooling_mode_") for key, on in config.items()
                   if key.startswith("pooling_mode_") and on is True)
    if modes != ["mean_tokens"]:
        raise ValueError(f"{config_path} asks for pooling {modes or 'none'}; this task does mean pooling only")


def pad_batch(items: Sequence[TokenizedText], pad_id: int = 0) -> PaddedBatch:
    """Right-pad ``items`` to the longest one. ``items`` must not be empty."""
    max_tokens = max(item.num_tokens for item in items)
    input_ids = np.full((len(items), max_tokens), pad_id, dtype=np.int64)  # (batch, max_tokens)
    attention_mask = np.zeros((len(items), max_tokens), dtype=np.int64)  # (batch, max_tokens)
    for row, item in enumerate(items):
        input_ids[row, : item.num_tokens] = item.ids
        attention_mask[row, : item.num_tokens] = 1
    return PaddedBatch(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=np.zeros_like(input_ids))


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Average the hidden states of attended tokens: (batch, tokens, dim), (batch, tokens) -> (batch, dim).

    Padding positions count for nothing, so an item's embedding does not depend on its batch-mates.
    """
    mask = attention_mask.astype(hidden.dtype)[:, :, None]  # (batch, tokens, 1)
    summed = (hidden * mask).sum(axis=1)  # (batch, dim)
    counts = np.maximum(mask.sum(axis=1), 1e-9)  # (batch, 1); never divide by zero
    return (summed / counts).astype(np.float32)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Scale each row to unit L2 norm; an all-zero row stays zero. (batch, dim) -> (batch, dim)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (batch, 1)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def format_vectors(vectors: np.ndarray, output_format: OutputFormat) -> list[Any]:
    """One JSON-serialisable result per row.

    ``list``: a list of floats. ``base64``: the row as float32 little-endian bytes, base64-encoded (decode
    with ``np.frombuffer(base64.b64decode(s), dtype="<f4")``).
    """
    if output_format == "list":
        return [row.tolist() for row in vectors.astype(np.float32)]
    if output_format == "base64":
        little_endian = vectors.astype("<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little_endian]
    raise ValueError(f"unknown output format {output_format!r}; expected 'list' or 'base64'")


def result_schema(output_format: OutputFormat) -> dict[str, Any]:
    """JSON Schema of one result of :func:`format_vectors` (``format: float``: 32-bit values)."""
    if output_format == "list":
        return {"type": "array", "items": {"type": "number", "format": "float"}}
    return {"type": "string", "contentEncoding": "base64"}


def decode_base64_vector(text: str) -> np.ndarray:
    """Inverse of the ``base64`` output format: (dim,) float32."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def as_text(value: Any) -> str:
    """A record value as text (bytes decoded as UTF-8); RecordError for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError("the input is not valid UTF-8 text") from None
    raise RecordError(f"text-embedding expects a string, got {type(value).__name__}")


def item_length(item: Any) -> int:
    """An engine's ``item_length``: tokens for a tokenised text, 1 for anything else (raw task items)."""
    return item.num_tokens if isinstance(item, TokenizedText) else 1


def load_task(model_dir: Path, max_length: int) -> TextEmbeddingTask:
    """The text-embedding task for the model in ``model_dir``: its pooling must be mean pooling and its
    ``tokenizer.json`` must load. Raises EngineStartError with one line otherwise."""
    try:
        check_pooling_config(model_dir)
    except (ValueError, OSError) as err:
        raise EngineStartError(first_line(err)) from None
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise EngineStartError(f"no tokenizer.json in {model_dir}; the text-embedding task needs it")
    try:
        return TextEmbeddingTask(tokenizer_path, max_length)
    except Exception as err:  # tokenizers raises plain Exceptions for unreadable files
        raise EngineStartError(f"cannot load {tokenizer_path}: {first_line(err)}") from None
