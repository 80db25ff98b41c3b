"""The PyTorch engine: MiniLM embeddings against the ONNX engine, the raw task over factory / TorchScript /
torch.export modules, and one-line start-up errors. GPU tests run only where CUDA is visible."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext, EngineStartError, RecordError
from sluice.engines.onnx.onnx_engine import ENGINE_TYPE as ONNX_TYPE
from sluice.engines.onnx.onnx_engine import OnnxOptions
from sluice.engines.torch.torch_engine import ENGINE_TYPE, TorchEngine, TorchOptions
from tests.support.texts import varied_texts

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

_FACTORY_SOURCE = '''
import torch


class Scale(torch.nn.Module):
    """y = scale * x (float inputs), plus the row sums as a second output."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(scale))

    def forward(self, x: torch.Tensor):
        y = self.scale * x
        return y, y.sum(dim=-1)


def build(scale: float = 2.0) -> torch.nn.Module:
    return Scale(scale)


def not_a_module() -> str:
    return "nope"
'''


def _engine(max_batch_size: int = 16, **options: Any) -> TorchEngine:
    return ENGINE_TYPE.factory(TorchOptions(**options), EngineContext(max_batch_size=max_batch_size))


def _embed(engine: Any, items: list[Any], batch_size: int = 16) -> np.ndarray:
    """Batches of similar lengths (as ``bucket_by: tokens`` makes them), results back in input order.

    Length order keeps padding, and so CPU time, small; padding invariance has its own test below.
    """
    order = sorted(range(len(items)), key=lambda i: items[i].num_tokens)
    out: list[Any] = [None] * len(items)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for index, vector in zip(chunk, engine.infer([items[i] for i in chunk]), strict=True):
            out[index] = vector
    return np.asarray(out, dtype=np.float32)  # (num_texts, dim)


@pytest.fixture(scope="module")
def engine(minilm_dir: Path) -> TorchEngine:
    engine = _engine(model="minilm-l6", warmup=False)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def reference(minilm_dir: Path, engine: TorchEngine) -> tuple[list[Any], np.ndarray]:
    """200 varied texts tokenised once, and the ONNX engine's (CPU) embeddings of them: (200, 384)."""
    onnx_engine = ONNX_TYPE.factory(OnnxOptions(model="minilm-l6", providers=["cpu"], warmup=False),
                                    EngineContext(max_batch_size=16))
    onnx_engine.start()
    texts = varied_texts(200)
    items = engine.prepare(texts)
    # Both engines tokenise with the same tokenizer.json and max_length, so one tokenisation serves both.
    assert all(np.array_equal(a.ids, b.ids) for a, b in zip(items[:20], onnx_engine.prepare(texts[:20]),
                                                            strict=True))
    return items, _embed(onnx_engine, items)


def _cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def test_embeddings_match_the_onnx_engine_on_200_varied_texts(engine: TorchEngine,
                                                              reference: tuple[list[Any], np.ndarray]) -> None:
    items, want = reference
    got = _embed(engine, items)
    assert got.shape == (200, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosines = _cosines(got, want)
    assert cosines.min() >= 0.999, f"item {int(np.argmin(cosines))} has cosine {cosines.min():.5f}"
    assert max(engine.item_length(item) for item in items) == 256  # long texts truncated


def test_an_embedding_does_not_depend_on_its_batch_mates(engine: TorchEngine) -> None:
    alone = engine.infer(engine.prepare(["short review"]))[0]
    mixed = engine.infer(engine.prepare(["short review", "a much longer review " * 30, ""]))[0]
    np.testing.assert_allclose(alone, mixed, atol=1e-5)


def test_non_string_input_is_a_record_error(engine: TorchEngine) -> None:
    with pytest.raises(RecordError, match="expects a string, got int"):
        engine.prepare([42])
    with pytest.raises(RecordError, match="UTF-8"):
        engine.prepare([b"\xff\xfe"])
    assert engine.infer([]) == []


def test_half_precision_on_a_cpu_warns_and_runs_float32(factory_module: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine(factory=f"{factory_module}:build", task="raw", inputs={"x": "x"}, outputs=["y", "s"],
                     device="cpu", dtype="float16")
    with caplog.at_level(logging.WARNING, logger="sluice.engines.torch.torch_engine"):
        engine.start()
    assert engine.dtype == torch.float32
    assert "float16 is for CUDA devices" in caplog.text


# --------------------------------------------------------------------------------------------- raw task


@pytest.fixture(scope="module")
def factory_module(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An importable module ``tiny_torch_factory`` defining ``build(scale)`` and ``not_a_module()``."""
    folder = tmp_path_factory.mktemp("factory")
    (folder / "tiny_torch_factory.py").write_text(textwrap.dedent(_FACTORY_SOURCE))
    sys.path.insert(0, str(folder))
    return "tiny_torch_factory"


def test_a_factory_module_runs_the_raw_task(factory_module: str) -> None:
    engine = _engine(factory=f"{factory_module}:build", factory_kwargs={"scale": 3.0}, task="raw",
                     inputs={"x": "data.values"}, outputs=["y", "s"])
    engine.start()
    items = engine.prepare([{"data": {"values": [1, 2]}}, {"data": {"values": [1, 1, 1]}},
                            {"data": {"values": [0.5, 0]}}])
    assert engine.infer(items) == [{"y": [3.0, 6.0], "s": 9.0}, {"y": [3.0, 3.0, 3.0], "s": 9.0},
                                   {"y": [1.5, 0.0], "s": 1.5}]
    with pytest.raises(RecordError, match="dimensions"):
        engine.prepare([{"data": {"values": [[1.0]]}}])
    with pytest.raises(RecordError, match="no field"):
        engine.prepare([{"data": {}}])


def test_declared_input_shapes_are_checked_per_record(factory_module: str) -> None:
    engine = _engine(factory=f"{factory_module}:build", task="raw", inputs={"x": "x"},
                     input_shapes={"x": [2, 3]}, outputs=["y", "s"])
    engine.start()
    (result,) = engine.infer(engine.prepare([{"x": [[1, 2, 3], [4, 5, 6]]}]))
    assert result["s"] == [12.0, 30.0]
    with pytest.raises(RecordError, match="expects 3"):
        engine.prepare([{"x": [[1, 2], [3, 4]]}])


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_a_torchscript_file_runs_the_raw_task(tmp_path: Path) -> None:
    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0 + 1.0

    path = tmp_path / "affine.ts"
    torch.jit.save(torch.jit.script(Affine()), str(path))
    engine = ENGINE_TYPE.factory(TorchOptions(torchscript="affine.ts", task="raw", inputs={"x": "v"}),
                                 EngineContext(max_batch_size=4, pipeline_dir=str(tmp_path)))
    engine.start()
    assert engine.infer(engine.prepare([{"v": [0, 1]}, {"v": [2, 3]}])) == [{"output": [1.0, 3.0]},
                                                                           {"output": [5.0, 7.0]}]


def test_an_exported_program_runs_the_raw_task(tmp_path: Path) -> None:
    class Square(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"squared": x * x, "unused": x}

    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Square(), (torch.ones(2, 3),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "square.pt2"))
    engine = _engine(exported=str(tmp_path / "square.pt2"), task="raw", inputs={"x": "x"},
                     input_shapes={"x": [3]}, outputs=["squared"])
    engine.start()
    assert engine.infer(engine.prepare([{"x": [1, 2, 3]}, {"x": [-1, 0, 4]}])) == [
        {"squared": [1.0, 4.0, 9.0]}, {"squared": [1.0, 0.0, 16.0]}]


# ------------------------------------------------------------------------------------ start-up errors


def _one_line_start_error(engine: TorchEngine) -> str:
    with pytest.raises(EngineStartError) as caught:
        engine.start()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_factories_fail_at_start_with_one_line(factory_module: str) -> None:
    raw: dict[str, Any] = {"task": "raw", "inputs": {"x": "x"}}
    assert "cannot import factory module 'no_such_pkg.mod'" in _one_line_start_error(
        _engine(factory="no_such_pkg.mod:build", **raw))
    assert "has no callable 'missing'" in _one_line_start_error(_engine(factory=f"{factory_module}:missing", **raw))
    assert "returned str, not a torch.nn.Module" in _one_line_start_error(
        _engine(factory=f"{factory_module}:not_a_module", **raw))
    # build() returns two outputs; naming one is caught by the warm-up run, before any record.
    assert "returned 2 output(s)" in _one_line_start_error(_engine(factory=f"{factory_module}:build", **raw))


def test_missing_files_fail_at_start(tmp_path: Path) -> None:
    assert "does not exist" in _one_line_start_error(
        _engine(torchscript=str(tmp_path / "none.ts"), task="raw", inputs={"x": "x"}))
    assert "does not exist" in _one_line_start_error(_engine(model=str(tmp_path / "no-model")))
    (tmp_path / "empty").mkdir()
    assert "no tokenizer.json" in _one_line_start_error(_engine(model=str(tmp_path / "empty")))


@pytest.mark.skipif(CUDA, reason="CUDA is visible here")
def test_pinning_cuda_without_a_gpu_fails_at_start(minilm_dir: Path) -> None:
    message = _one_line_start_error(_engine(model="minilm-l6", device="cuda"))
    assert "no CUDA GPU is visible" in message and "device: auto" in message


def test_options_reject_bad_combinations() -> None:
    cases = [
        ({"model": "m", "factory": "a.b:c"}, "exactly one of"),
        ({}, "exactly one of"),
        ({"factory": "a.b:c"}, "use 'model'"),
        ({"model": "m", "task": "raw", "inputs": {"x": "x"}}, "not 'model'"),
        ({"factory": "a.b:c", "task": "raw"}, "needs 'inputs'"),
        ({"factory": "a.b:c", "task": "raw", "inputs": {"x": "x"}, "input_shapes": {"y": [1]}}, "'y'"),
        ({"model": "m", "normalise": False}, "normalise"),
        ({"model": "m", "device": "gpu"}, "device"),
        ({"model": "m", "dtype": "half"}, "dtype"),
        ({"factory": "no-colon", "task": "raw", "inputs": {"x": "x"}}, "factory"),
    ]
    for options, fragment in cases:
        with pytest.raises(ValidationError, match=fragment):
            TorchOptions.model_validate(options)


def test_the_registry_finds_the_engine_without_importing_torch() -> None:
    assert engine_types.lookup("torch") is ENGINE_TYPE
    code = "import sys, sluice.engines.torch.torch_engine; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(("dtype", "compile_module", "min_cosine"), [
    ("float32", False, 0.999), ("float16", False, 0.999), ("float16", True, 0.999),
    ("bfloat16", False, 0.99),  # bf16 keeps 8 mantissa bits: ~0.998 typical, not held to 0.999
])
def test_cuda_embeddings_match_the_cpu_reference(dtype: str, compile_module: bool, min_cosine: float,
                                                 reference: tuple[list[Any], np.ndarray]) -> None:
    items, want = reference
    engine = _engine(max_batch_size=32, model="minilm-l6", device="cuda", dtype=dtype, compile=compile_module)
    engine.start()
    assert engine.device.type == "cuda" and engine.dtype == getattr(torch, dtype)
    cosines = _cosines(_embed(engine, items, batch_size=32), want)
    assert cosines.min() >= min_cosine, f"{dtype}: worst cosine {cosines.min():.5f}"
    engine.close()


@pytest.mark.gpu
@requires_cuda
def test_auto_picks_the_gpu_and_raw_inputs_follow_the_half_dtype(factory_module: str) -> None:
    engine = _engine(factory=f"{factory_module}:build", task="raw", inputs={"x": "x"}, outputs=["y", "s"],
                     dtype="float16")
    engine.start()
    assert engine.device.type == "cuda" and engine.dtype == torch.float16
    assert engine.infer(engine.prepare([{"x": [1.0, 2.5]}])) == [{"y": [2.0, 5.0], "s": 7.0}]


def test_the_torch_example_is_the_onnx_example_with_another_engine_type() -> None:
    from sluice.config import load_pipeline

    examples = Path(__file__).resolve().parents[2] / "examples" / "pipelines"
    onnx_pipeline = load_pipeline(examples / "embed-reviews.yaml", environ={})
    torch_pipeline = load_pipeline(examples / "embed-reviews-torch.yaml", environ={})
    assert torch_pipeline.pipeline.engine.type == "torch"
    assert (torch_pipeline.pipeline.model_dump(exclude={"engine"})
            == onnx_pipeline.pipeline.model_dump(exclude={"engine"}))
    for option in ("model", "task", "max_length", "normalize", "output_format"):
        assert getattr(torch_pipeline.engine_options, option) == getattr(onnx_pipeline.engine_options, option)
