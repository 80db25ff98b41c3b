"""``quantize: int8`` for the onnx engine on the real all-MiniLM-L6-v2, against the float32 engine.

The int8 file is made once beside the model and found again; the vectors stay close to the float32
engine's on 200 varied texts (cosine, the figure the engine also logs at start on its probe texts); a
record's vector still depends only a little on its batch mates (activations are quantised per batch).
Smoothing leaves the float32 model's outputs as they were, calibrated with the model's tokenizer or,
without one, on random ids; a model whose inputs are not token ids is left unsmoothed.
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
        if ".int8-" not in f.name:  # an int8 file the engine made beside the shared model is not this test's
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
    assert cosines.mean() >= 0.994 and cosines.min() >= 0.98  # 0.9954 / 0.9863 seen (0.991 / 0.967 unsmoothed)
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


def _mean_pooled(model: Any, ids: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: ids if i.name == "input_ids" else (np.ones_like(ids) if i.name == "attention_mask" else
             np.zeros_like(ids)) for i in session.get_inputs()}  # fmt: skip
    return np.asarray(session.run(None, feeds)[0]).mean(axis=1)


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_smoothing_leaves_the_float32_model_as_it_was(minilm_dir: Path, with_tokenizer: bool) -> None:
    import onnx

    from sluice.engines.backends.onnx_int8 import _narrowing, _smooth

    original = onnx.load(str(minilm_dir / "model.onnx"))
    smoothed = onnx.load(str(minilm_dir / "model.onnx"))
    narrowing = _narrowing(smoothed)
    assert len(narrowing) == 6 and all("output/dense" in n and "attention" not in n for n in narrowing)  # FFN outputs
    count = _smooth(smoothed, skip=set(narrowing[:1]),
                    tokenizer=minilm_dir / "tokenizer.json" if with_tokenizer else None)  # fmt: skip
    assert count == 35  # 6 layers x (Q, K, V, attention output, FFN input, FFN output), but the one kept float32
    assert sum(n.op_type == "Mul" for n in smoothed.graph.node) == sum(n.op_type == "Mul" for n in original.graph.node) + 35
    ids = np.asarray([[101, 7592, 2088, 999, 102], [101, 2023, 2003, 1037, 3231]], dtype=np.int64)
    want, got = _mean_pooled(original, ids), _mean_pooled(smoothed, ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_model_without_token_inputs_is_not_smoothed() -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from sluice.engines.backends.onnx_int8 import _smooth

    weight = numpy_helper.from_array(np.ones((4, 2), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [weight])  # fmt: skip
    model = helper.make_model(graph)
    assert _smooth(model, skip=set()) == 0 and [n.op_type for n in model.graph.node] == ["MatMul"]
    onnx.checker.check_model(model)


def test_a_model_the_calibration_cannot_run_is_quantised_unsmoothed(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from sluice.engines.backends.onnx_int8 import _smooth

    # token ids reshaped to a fixed (2, 3): the random calibration sequences of other lengths cannot run
    inits = [numpy_helper.from_array(np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32), "emb"),
             numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "w"),
             numpy_helper.from_array(np.asarray([2, 3], dtype=np.int64), "shape")]  # fmt: skip
    nodes = [helper.make_node("Reshape", ["input_ids", "shape"], ["ids"], name="reshape"),
             helper.make_node("Gather", ["emb", "input_ids"], ["h0"], name="gather"),
             helper.make_node("Gather", ["emb", "ids"], ["h"], name="gather_fixed"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="mm")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [2, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level(logging.WARNING):
        assert _smooth(model, skip=set()) == 0
    assert "int8 calibration failed" in caplog.text and [n.op_type for n in model.graph.node][-1] == "MatMul"
    onnx.save(model, tmp_path / "model.onnx")
    assert int8_model(tmp_path / "model.onnx").is_file()  # quantised all the same
