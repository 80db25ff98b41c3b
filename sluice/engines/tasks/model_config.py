"""What a task needs from a model directory's JSON files, read without transformers or torch.

``config.json`` (labels, problem type, length limits), ``tokenizer_config.json`` /
``special_tokens_map.json`` (special tokens, ``model_max_length``) and ``sentence_bert_config.json``
(sentence-transformers' ``max_seq_length``, ``do_lower_case``). Every reader returns plain data; a missing
file reads as empty, a file that is not JSON is an EngineStartError naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.engines.engine_contract import EngineStartError

# transformers' tokenizer_config.json writes 1e30 for "no limit"
_NO_LIMIT = 10**18
# Models whose position ids start after the padding index: max_position_embeddings counts two extra slots.
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "mpnet",
                     "data2vec-text", "xmod", "ibert", "luke", "markuplm"}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; ``{}`` when absent. EngineStartError when it is not a JSON object."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EngineStartError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise EngineStartError(f"{path} is not a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The parts of ``config.json`` tasks use."""

    path: Path  # the config.json (which may not exist)
    exists: bool
    model_type: str
    architectures: tuple[str, ...]
    id2label: dict[int, str] | None  # None when config.json has no id2label
    problem_type: str | None
    max_position_embeddings: int | None
    pad_token_id: int | None
    sentence_transformers: dict[str, Any]  # config.json's "sentence_transformers" section (cross-encoders)
    raw: dict[str, Any]

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 0

    def position_limit(self) -> int | None:
        """The longest input the position embeddings allow, or None when unknown/unbounded."""
        limit = self.max_position_embeddings
        if limit is None or limit <= 0:
            return None
        if self.model_type in _OFFSET_POSITIONS:
            return limit - ((self.pad_token_id or 0) + 1)
        return limit


def read_model_config(directory: Path) -> ModelConfig:
    path = directory / "config.json"
    raw = read_json(path)
    id2label = raw.get("id2label")
    labels: dict[int, str] | None = None
    if isinstance(id2label, dict) and id2label:
        try:
            labels = {int(key): str(value) for key, value in id2label.items()}
        except ValueError:
            raise EngineStartError(f"{path}: id2label keys must be label indices, got {sorted(id2label)}") from None
    architectures = raw.get("architectures") or ()
    max_positions = raw.get("max_position_embeddings")
    pad_id = raw.get("pad_token_id")
    section = raw.get("sentence_transformers")
    return ModelConfig(path=path, exists=path.is_file(), model_type=str(raw.get("model_type", "")),
                       architectures=tuple(str(a) for a in architectures), id2label=labels,
                       problem_type=raw.get("problem_type"),
                       max_position_embeddings=max_positions if isinstance(max_positions, int) else None,
                       pad_token_id=pad_id if isinstance(pad_id, int) else None,
                       sentence_transformers=section if isinstance(section, dict) else {}, raw=raw)


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    """Special tokens and the length limit from ``tokenizer_config.json`` and ``special_tokens_map.json``."""

    pad_token: str | None
    unk_token: str | None
    model_max_length: int | None  # None: not given, or "no limit"


def read_tokenizer_config(directory: Path) -> TokenizerConfig:
    config = read_json(directory / "tokenizer_config.json")
    special = read_json(directory / "special_tokens_map.json")

    def token(key: str) -> str | None:
        value = config.get(key, special.get(key))
        if isinstance(value, dict):  # {"content": "[PAD]", "lstrip": false, ...}
            value = value.get("content")
        return value if isinstance(value, str) else None

    max_length = config.get("model_max_length")
    limited = int(max_length) if isinstance(max_length, (int, float)) and 0 < max_length < _NO_LIMIT else None
    return TokenizerConfig(pad_token=token("pad_token"), unk_token=token("unk_token"), model_max_length=limited)


def default_max_length(model: ModelConfig, tokenizer: TokenizerConfig, fallback: int = 512) -> int:
    """The truncation length transformers uses for this model: the tokenizer's ``model_max_length`` capped
    by the position embeddings (as sentence-transformers does); ``fallback`` when neither says."""
    limits = [n for n in (tokenizer.model_max_length, model.position_limit()) if n is not None]
    return min(limits) if limits else fallback


def sentence_bert_config(directory: Path) -> dict[str, Any]:
    """``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``), ``{}`` when absent."""
    return read_json(directory / "sentence_bert_config.json")
