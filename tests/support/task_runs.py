"""Running a started task engine as the operator does, for parity tests against a reference."""

from __future__ import annotations

from typing import Any

import numpy as np


def infer_one_by_one(engine: Any, values: list[Any], batch_size: int = 8) -> list[Any]:
    """Each value prepared alone (as the operator finds a failing record), batches in arrival order."""
    items = [engine.prepare([value])[0] for value in values]
    results: list[Any] = []
    for start in range(0, len(items), batch_size):
        results.extend(engine.infer(items[start : start + batch_size]))
    return results


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (rows, dim) arrays."""
    return (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
