"""Which model produced an output: its name, its content hash and the engine that ran it.

Every output and dead letter carries it in the ``sluice.model`` header; the engine metrics carry the same
text as their ``model`` label and the start-up log prints it. The format is one short line::

    <name>@sha256:<first 12 hex digits of the content digest> (<engine type>)
    minilm-l6@sha256:1a2b3c4d5e6f (onnx)

``name`` never holds ``@``, spaces or parentheses (they become ``_``), so :func:`parse_label` splits it
back. Twelve hex digits (48 bits) tell the versions of one model apart with room to spare; the start-up
log and the ``sluice_model_info`` metric give the full digest. What the digest covers, and what it costs,
is :mod:`sluice.model_store.digest`; finding and hashing a model on disk, :mod:`sluice.engines.model_source`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

MODEL_HEADER = "sluice.model"
SHORT_DIGEST = 12

_UNSAFE = re.compile(r"[@\s()]+")
_LABEL = re.compile(r"^(?P<name>[^@\s()]+)@sha256:(?P<digest>[0-9a-f]{12}) \((?P<engine>[A-Za-z0-9_.-]+)\)$")
# suffixes of model files, left out of the name (``v2/model.onnx`` is "v2", ``bert.onnx`` is "bert")
_MODEL_SUFFIXES = {".onnx", ".gguf", ".pt", ".pt2", ".pth", ".ts", ".plan", ".engine", ".safetensors", ".bin",
                   ".pkl", ".joblib", ".json"}


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where an engine's model comes from, known before it loads (cheap: no reading).

    ``path`` is what the pipeline names, symlinks kept (swapping a symlink is one way to roll a new version
    out): the reload watcher polls it and the digest hashes what it leads to. For a model built in code
    (a Python function, a torch factory) it is the module's source file, hashed but not ``reloadable``.
    None: nothing on disk to hash (the digest is then the name's).
    """

    name: str
    path: Path | None
    reloadable: bool = True


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """A model as outputs name it; see the module docstring."""

    name: str
    digest: str  # SHA-256 of the content, 64 hex digits
    engine: str  # the engine type (onnx, torch, tensorrt, python, llm)

    @property
    def label(self) -> str:
        """The ``sluice.model`` header's text and the metrics' ``model`` label."""
        return f"{safe_name(self.name)}@sha256:{self.digest[:SHORT_DIGEST]} ({self.engine})"

    @property
    def header(self) -> bytes:
        return self.label.encode()


def parse_label(text: str) -> tuple[str, str, str]:
    """``(name, short digest, engine)`` of a ``sluice.model`` header; ValueError when it is not one."""
    match = _LABEL.match(text)
    if match is None:
        raise ValueError(f"not a sluice.model header: {text[:100]!r}")
    return match["name"], match["digest"], match["engine"]


def model_name(reference: str) -> str:
    """A short name for the model a pipeline refers to as ``reference`` (a known model name, a path).

    A known name stays as it is; a path gives its last part without a model-file suffix, or the directory
    holding it when that part is just ``model`` (``models/v2/model.onnx`` is "v2")."""
    given = Path(reference)
    name = given.stem if given.suffix in _MODEL_SUFFIXES else given.name
    if name == "model" and given.parent.name:
        name = given.parent.name
    return safe_name(name or reference)


def name_digest(name: str) -> str:
    """The digest of a model that has nothing on disk to hash: its name's."""
    return hashlib.sha256(f"sluice-named-model\0{name}".encode()).hexdigest()


def safe_name(name: str) -> str:
    return _UNSAFE.sub("_", name).strip("_") or "model"


def code_source(name: str, module: str | None) -> ModelSource:
    """The source of a model built in code, ``name`` (``package.module:function``): the module's source
    file, found without importing the module itself (None when it cannot be found)."""
    import importlib.util

    path = None
    if module:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and spec.has_location:
            path = Path(spec.origin)
    return ModelSource(name=safe_name(name), path=path, reloadable=False)
