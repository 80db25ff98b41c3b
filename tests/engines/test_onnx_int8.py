"""``quantize: int8`` for the onnx engine on the real all-MiniLM-L6-v2, against the float32 engine.

The int8 file is made once beside the model and found again; the vectors stay close to the float32
engine's on 200 varied texts (cosine, the figure the engine also logs at start on its probe texts); a
record's vector still depends only a little on its batch mates (activations are quantised per batch).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.engines.backends.onnx_int8 import int8_model
from sluice.engines.base import EngineContext
from sluice.engines.onnx import ENGINE_TYPE, OnnxEngine, OnnxOptions
from tests.support.texts import varied_texts


def _engine(model: Path, **options: Any) -> OnnxEngine:
    opts = OnnxOptions(model=str(model), providers=["cpu"], intra_op_num_threads=2, **options)
    engine = ENGINE_TYPE.factory(opts, EngineContext(max_batch_size=32))
    engine.start()
    return engine


def _vectors(engine: OnnxEngine, texts: list[str], batch_size: int = 32) -> np.ndarray:
    items = engine.prepare(texts)
    rows = [row for start in range(0, len(items), batch_size) for row in engine.infer(items[start : start + batch_size])]
    return np.asarray(rows, dtype=np.float64)


@pytest.fixture(scope="module")
def model_copy(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM in a folder of its own, so that the int8 file this module makes beside it is its own."""
    folder = tmp_path_factory.mktemp("minilm")
    for f in minilm_dir.iterdir():
        (shutil.copytree if f.is_dir() else shutil.copy)(f, folder / f.name)
    return folder


@pytest.mark.slow
def test_int8_vectors_stay_close_to_float32_and_the_file_is_cached(model_copy: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with caplog.at_level(logging.INFO):
        int8 = _engine(model_copy, quantize="int8")
    made = sorted(model_copy.glob("model.int8-*.onnx"))
    assert len(made) == 1 and int8.backend.model_file == made[0]
    # the encoder's matmul weights int8 (a quarter of their bytes); the embedding tables stay float32
    assert made[0].stat().st_size < 0.7 * (model_copy / "model.onnx").stat().st_size
    low, mean = int8.int8_agreement or (0.0, 0.0)
    assert low > 0.95 and mean > 0.98
    assert f"min {low:.4f}, mean {mean:.4f}" in caplog.text  # reported at start
    reference = _engine(model_copy)
    texts = varied_texts(200)
    got, want = _vectors(int8, texts), _vectors(reference, texts)
    cosines = (got * want).sum(axis=1)  # both unit length
    print(f"\nMiniLM int8 vs float32 on 200 varied texts: cosine min {cosines.min():.4f}, mean {cosines.mean():.4f}")
    assert cosines.mean() >= 0.99 and cosines.min() >= 0.95
    # found again, not made again: same file, same bytes
    mtime = made[0].stat().st_mtime_ns
    assert int8_model(model_copy / "model.onnx") == made[0] and made[0].stat().st_mtime_ns == mtime
    # batch mates move a vector a little (activation scales are per batch), never far
    alone = _vectors(int8, ["short review"])[0]
    mixed = _vectors(int8, ["short review", "a much longer review with many words " * 20, "👍"])[0]
    assert float(alone @ mixed) > 0.98  # 0.988 seen: a short text beside a long one


def test_int8_goes_to_the_cache_when_the_model_folder_is_read_only(model_copy: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import os

    folder = tmp_path / "ro"
    folder.mkdir()
    shutil.copy(model_copy / "model.onnx", folder / "model.onnx")
    real_access = os.access
    # a folder the process cannot write to (as root, chmod would not stop it)
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    out = int8_model(folder / "model.onnx", cache_dir=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" and out.is_file() and not list(folder.glob("*.int8-*"))
    assert int8_model(folder / "model.onnx", cache_dir=tmp_path / "cache") == out
