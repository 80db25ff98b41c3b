"""How numeric results leave the engine: JSON lists of floats, or base64 float32 bytes."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np

OutputFormat = Literal["list", "base64"]


def format_vectors(vectors: np.ndarray, output_format: OutputFormat) -> list[Any]:
    """One JSON-serialisable result per row.

    ``list``: a list of floats. ``base64``: the row as float32 little-endian bytes, base64-encoded (decode
    with :func:`decode_base64_vector`).
    """
    if output_format == "list":
        return [row.tolist() for row in vectors.astype(np.float32, copy=False)]
    if output_format == "base64":
        little_endian = vectors.astype("<f4", copy=False)
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little_endian]
    raise ValueError(f"unknown output format {output_format!r}; expected 'list' or 'base64'")


def format_array(array: np.ndarray, output_format: OutputFormat) -> Any:
    """One array of any shape: nested lists, or its float32 little-endian bytes in base64."""
    if output_format == "base64":
        return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")
    return array.tolist()


def decode_base64_vector(text: str) -> np.ndarray:
    """Inverse of the ``base64`` output format: (dim,) float32."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Scale each row to unit L2 norm; an all-zero row stays zero. (batch, dim) -> (batch, dim)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (batch, 1)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
