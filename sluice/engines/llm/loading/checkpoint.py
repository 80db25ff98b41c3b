"""What a checkpoint says before its weights are read: its model family and its architecture.

A HF directory's ``config.json`` (with ``generation_config.json``'s stop tokens), or a GGUF file's header,
read through the family registry (``model/families/family_registry.py``). Everything the engine refuses about a model
from these alone is refused here, as a ValueError of one line: an architecture or ``model_type`` that no
family runs, a GGUF ``general.architecture`` likewise, an unsupported activation or rope scaling, a shape
the engine cannot build, a ``config.json`` lacking a key its family needs, a directory without weights.

The loader (``weights.py``) reads every checkpoint through :func:`read_checkpoint` before its tensors, and
``sluice validate`` calls it alone (through the operator engine's ``check_model``), so the two refuse the
same models. Guarantees: imports no torch; reads no weights (a GGUF file is memory-mapped and its header
parsed; only the few small tensors some families keep config in, such as rope factors, are read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.loading.gguf_file import GGUFFile
from sluice.engines.llm.model.families.common import GGUFMetadata, ModelFamily, eos_ids
from sluice.engines.llm.model.families.family_registry import family_for_gguf, family_for_hf


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's files, family and architecture, as read before its weights."""

    path: Path  # the .gguf file, or the HF directory
    family: ModelFamily
    config: ModelConfig
    gguf: GGUFFile | None = None  # the parsed GGUF file (its tensors are read from it); None for a HF directory


def find_gguf(path: str | Path) -> Path | None:
    """``path`` itself if it is a ``.gguf`` file, the single ``.gguf`` in a directory without
    ``config.json``, else None."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return None


def read_checkpoint(path: str | Path, gguf_file: GGUFFile | None = None) -> Checkpoint:
    """The checkpoint at ``path``: a ``.gguf`` file (or a directory holding one), or a directory with
    ``config.json`` and ``*.safetensors``. ValueError (one line) naming what the engine cannot run;
    OSError when a file cannot be read. ``gguf_file``: that GGUF file already opened."""
    path = Path(path)
    gguf = find_gguf(path)
    if gguf is not None:
        file = gguf_file if gguf_file is not None else GGUFFile(gguf)
        family = family_for_gguf(GGUFMetadata(file).arch)
        return Checkpoint(gguf, family, model_config_from_gguf(file), file)
    if path.is_dir() and (path / "config.json").is_file():
        return _read_hf_dir(path)
    raise ValueError(f"{path} is neither a .gguf file nor a directory with config.json and *.safetensors")


def read_model_checkpoint(model: str, base_dir: str | Path | None = None) -> Checkpoint:
    """:func:`read_checkpoint` of the files ``model`` names, found as the engine finds them
    (``loading/model_files.py``) but never fetched: a known model not fetched yet, or a path that does not exist, is a
    ValueError saying so."""
    from sluice.model_store import ModelError, resolve_model

    try:
        path = resolve_model(model, base_dir=base_dir)
    except ModelError as err:
        raise ValueError(str(err)) from None
    return read_checkpoint(path)


def model_config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of a HF ``config.json`` dict (ValueError naming what is unsupported)."""
    family = family_for_hf(cfg)
    try:
        return family.config_from_hf(cfg)
    except KeyError as err:  # a key the family's parser reads without a default
        raise ValueError(f"config.json has no {err.args[0]!r}, which a {family.name} model needs") from None


def model_config_from_gguf(file: GGUFFile) -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file's metadata (ValueError naming what is unsupported)."""
    meta = GGUFMetadata(file)
    config_from_gguf = family_for_gguf(meta.arch).config_from_gguf
    assert config_from_gguf is not None  # family_for_gguf returns only families with a parser
    return config_from_gguf(meta)


def _read_hf_dir(path: Path) -> Checkpoint:
    raw = _json_object(path / "config.json")
    family = family_for_hf(raw)
    config = model_config_from_hf(raw)
    if (path / "generation_config.json").is_file():  # HF generate stops on these too (Gemma's <end_of_turn>)
        generation = _json_object(path / "generation_config.json")
        eos = tuple(dict.fromkeys((*config.eos_token_ids, *eos_ids(generation.get("eos_token_id")))))
        config = replace(config, eos_token_ids=eos)
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"no *.safetensors files in {path}")
    return Checkpoint(path, family, config)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as err:  # not JSON (a truncated download, say)
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data
