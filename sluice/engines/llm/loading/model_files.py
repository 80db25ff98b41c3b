"""Finding and loading a model for the LLM engine: what ``model`` names, then its weights and tokenizer.

``model`` is a known model name (``smollm2-135m``, fetched into the model cache on first use), a ``.gguf``
file, a directory holding one ``.gguf``, or a Hugging Face directory (``config.json`` and
``*.safetensors``). A relative path resolves against ``base_dir``: the pipeline file's directory when the
operator runs the engine, as for every other engine (:func:`sluice.model_store.download.resolve_model`), else the
working directory. This is the one place the LLM engine turns ``model`` into files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer
from sluice.engines.llm.loading.checkpoint import find_gguf
from sluice.engines.llm.loading.gguf_file import GGUFFile
from sluice.engines.llm.loading.weights import load_weights
from sluice.engines.llm.quant.gguf_rows import Loaded
from sluice.model_store.catalogue import KNOWN_MODELS, ModelError
from sluice.model_store.download import resolve_model


def resolve_model_path(model: str | Path, base_dir: str | Path | None = None) -> Path:
    """The files ``model`` names (see the module docstring). ValueError, one line, when there are none or a
    known model cannot be fetched."""
    try:
        if str(model) in KNOWN_MODELS:
            from sluice.model_store.download import fetch

            return fetch(str(model))
        return resolve_model(model, base_dir=base_dir)
    except ModelError as err:
        raise ValueError(str(err)) from None


@dataclass(slots=True)
class LoadedModel:
    """A model's architecture, its weights as read (not yet placed on a device) and its tokenizer."""

    config: ModelConfig
    tensors: dict[str, Loaded]  # handed to the model runner, which converts and places them
    tokenizer: ChatTokenizer | None  # None: the directory has no tokenizer (token-id prompts only)


def load_model(path: Path) -> LoadedModel:
    """Read the weights and tokenizer at ``path`` (from :func:`resolve_model_path`); a GGUF file is parsed
    once for both. Raises ValueError / OSError for files that are not a supported model."""
    gguf = find_gguf(path)
    reader = GGUFFile(gguf) if gguf is not None else None
    config, tensors = load_weights(path, reader)
    try:
        tokenizer: ChatTokenizer | None = (
            ChatTokenizer.from_gguf(gguf, reader) if gguf is not None else ChatTokenizer.from_path(path)
        )
    except ValueError:
        tokenizer = None
    return LoadedModel(config, tensors, tokenizer)


def describe_loaded(loaded: LoadedModel, path: Path) -> str:
    """One line for the start log: the architecture, the tensors, the files' size, the tokenizer."""
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.suffix in (".gguf", ".safetensors")]
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    tokenizer = "a tokenizer" if loaded.tokenizer is not None else "no tokenizer"
    return (f"{loaded.config.architecture}, {len(loaded.tensors)} tensors, {size_mb:.0f} MB, {tokenizer}")
