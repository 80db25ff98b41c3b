"""The native TensorRT engine: start-up errors by the real absence of a GPU / the package, the profile and
cache-key decisions, the build cache over a stand-in TensorRT, and (on a GPU machine) MiniLM parity."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext, EngineStartError
from sluice.engines.tensorrt import engine_build
from sluice.engines.tensorrt.build_plan import (
    GPU_MISSING,
    TENSORRT_MISSING,
    TORCH_MISSING,
    ShapeProfile,
    engine_cache_key,
    missing_requirements,
    shape_profile,
)
from sluice.engines.tensorrt.tensorrt_engine import ENGINE_TYPE, TensorrtEngine, TensorrtOptions
from tests.support.texts import varied_texts

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_CUDA = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()
requires_tensorrt_gpu = pytest.mark.skipif(not (HAS_TENSORRT and HAS_CUDA), reason="needs TensorRT and a CUDA GPU")


def _engine(max_batch_size: int = 32, **options: Any) -> TensorrtEngine:
    return ENGINE_TYPE.factory(TensorrtOptions(**options), EngineContext(max_batch_size=max_batch_size))


# ------------------------------------------------------------------------------------ start-up errors


@pytest.mark.skipif(HAS_TENSORRT and HAS_CUDA, reason="this machine has TensorRT and a GPU")
def test_start_names_what_this_machine_lacks_in_one_line(tmp_path: Path) -> None:
    # A model path that does not exist: the requirements are checked first, so it is never looked at.
    engine = _engine(model=str(tmp_path / "absent.onnx"))
    with pytest.raises(EngineStartError) as caught:
        engine.start()
    message = str(caught.value)
    assert message.startswith("engine tensorrt: ") and "\n" not in message
    assert (GPU_MISSING in message) is not HAS_CUDA
    assert (TENSORRT_MISSING in message) is not HAS_TENSORRT
    assert "absent.onnx" not in message


def test_missing_requirements_names_each_missing_piece_gpu_first() -> None:
    assert missing_requirements(has_gpu=True, has_tensorrt=True) is None
    assert missing_requirements(has_gpu=True, has_tensorrt=False) == f"engine tensorrt: {TENSORRT_MISSING}"
    assert missing_requirements(has_gpu=False, has_tensorrt=True) == f"engine tensorrt: {GPU_MISSING}"
    both = missing_requirements(has_gpu=False, has_tensorrt=False, has_torch=False)
    assert both == f"engine tensorrt: {GPU_MISSING}; {TENSORRT_MISSING}; {TORCH_MISSING}"
    assert "pip install tensorrt" in TENSORRT_MISSING and "torch.cuda.is_available() is False" in GPU_MISSING


def test_options_reject_cpu_devices_other_tasks_and_misspelt_keys() -> None:
    for options, fragment in [({"model": "m", "device": "cpu"}, "device"), ({"model": "m", "task": "raw"}, "task"),
                              ({"model": "m", "fp_16": True}, "fp_16"), ({"model": "m", "workspace_mb": 0}, "16")]:
        with pytest.raises(ValidationError, match=fragment):
            TensorrtOptions.model_validate(options)


def test_the_registry_finds_the_engine_without_importing_tensorrt_or_torch() -> None:
    assert engine_types.lookup("tensorrt") is ENGINE_TYPE
    code = "import sys, sluice.engines.tensorrt.tensorrt_engine; print('tensorrt' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ------------------------------------------------------------------------------- profile and cache key


def test_the_profile_follows_the_batching_settings() -> None:
    profile = shape_profile(max_batch_size=32, max_length=256)
    assert profile == ShapeProfile(min_shape=(1, 1), opt_shape=(16, 128), max_shape=(32, 256))
    assert shape_profile(1, 64).opt_shape == (1, 64)  # opt never exceeds max
    assert shape_profile(128, 512, opt_tokens=48).opt_shape == (64, 48)
    assert profile.fits(32, 256) and profile.fits(1, 1)
    assert not profile.fits(33, 10) and not profile.fits(4, 257)
    with pytest.raises(ValueError, match=">= 1"):
        shape_profile(0, 256)


def test_the_cache_key_changes_with_everything_that_invalidates_an_engine() -> None:
    base = dict(model_sha256="ab" * 32, tensorrt_version="10.13.0", gpu_name="NVIDIA H200 sm_90",
                profile=shape_profile(32, 256), fp16=False)
    key = engine_cache_key(**base)  # type: ignore[arg-type]
    assert key == engine_cache_key(**base)  # type: ignore[arg-type]
    changes = [("model_sha256", "cd" * 32), ("tensorrt_version", "11.4.0"), ("gpu_name", "NVIDIA L4 sm_89"),
               ("profile", shape_profile(64, 256)), ("fp16", True)]
    keys = {engine_cache_key(**{**base, field: value}) for field, value in changes}  # type: ignore[arg-type]
    assert len(keys) == len(changes) and key not in keys


# ------------------------------------------------------------------- build cache over a stand-in TensorRT


class _Logger:
    WARNING = 2

    def __init__(self, level: int) -> None:
        self.level = level


class _FakeTrt:
    """Just enough of the tensorrt module for load_or_build: counts builds, 'plans' are the profile's text."""

    __version__ = "10.99.0"
    Logger = _Logger
    MemoryPoolType = SimpleNamespace(WORKSPACE="workspace")

    def __init__(self) -> None:
        self.num_builds = 0
        self.BuilderFlag = SimpleNamespace(FP16="fp16")
        fake = self

        class Runtime:
            def __init__(self, logger: Any) -> None:
                pass

            def deserialize_cuda_engine(self, plan: bytes) -> Any:
                return None if plan.startswith(b"corrupt") else SimpleNamespace(plan=plan)

        class Builder:
            def __init__(self, logger: Any) -> None:
                self.shapes: list[Any] = []

            def create_network(self, flags: int) -> Any:
                inputs = [SimpleNamespace(name="input_ids", shape=(-1, -1))]
                return SimpleNamespace(num_inputs=1, get_input=inputs.__getitem__)

            def create_builder_config(self) -> Any:
                return SimpleNamespace(set_memory_pool_limit=lambda pool, size: None, set_flag=lambda flag: None,
                                       add_optimization_profile=lambda profile: None)

            def create_optimization_profile(self) -> Any:
                return SimpleNamespace(set_shape=lambda name, *shapes: self.shapes.append(shapes))

            def build_serialized_network(self, network: Any, config: Any) -> bytes:
                fake.num_builds += 1
                return repr(self.shapes).encode()

        self.Runtime, self.Builder = Runtime, Builder
        self.OnnxParser = lambda network, logger: SimpleNamespace(parse_from_file=lambda path: True)


def test_an_engine_is_built_once_then_loaded_from_the_cache(tmp_path: Path) -> None:
    trt = _FakeTrt()
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_bytes(b"model bytes")
    request = engine_build.BuildRequest(onnx_path=onnx_path, profile=shape_profile(8, 64), fp16=False,
                                          workspace_bytes=1 << 20, gpu_name="GPU", cache_dir=tmp_path / "cache")
    first = engine_build.load_or_build(trt, request)
    assert first.built and first.plan_path.is_file() and first.plan_path.name.startswith("model-")
    assert first.engine.plan == repr([((1, 1), (4, 64), (8, 64))]).encode()  # the profile reached the builder
    second = engine_build.load_or_build(trt, request)
    assert not second.built and second.plan_path == first.plan_path and trt.num_builds == 1

    first.plan_path.write_bytes(b"corrupt plan")  # e.g. written by another TensorRT build
    assert engine_build.load_or_build(trt, request).built and trt.num_builds == 2
    onnx_path.write_bytes(b"new model bytes")  # a new model: a new cache entry
    third = engine_build.load_or_build(trt, request)
    assert third.built and third.plan_path != first.plan_path
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([first.plan_path.name,
                                                                             third.plan_path.name])


def test_fp16_without_the_builder_flag_is_a_one_line_error(tmp_path: Path) -> None:
    trt = _FakeTrt()
    trt.BuilderFlag = SimpleNamespace()  # TensorRT 11 removed the FP16 flag
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_bytes(b"m")
    request = engine_build.BuildRequest(onnx_path=onnx_path, profile=shape_profile(8, 64), fp16=True,
                                          workspace_bytes=1 << 20, gpu_name="GPU", cache_dir=tmp_path)
    with pytest.raises(EngineStartError, match="fp16: true needs TensorRT 10") as caught:
        engine_build.load_or_build(trt, request)
    assert "\n" not in str(caught.value)


# --------------------------------------------------- the run path over a stand-in execution context (CPU)


class _FakeContext:
    """Reads its inputs from the bound addresses and writes hidden = [id % 7, id % 5, 1, mask] per token."""

    def __init__(self) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.streams: list[int] = []

    def set_input_shape(self, name: str, shape: tuple[int, int]) -> None:
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (*self.shapes["input_ids"], 4)

    def execute_async_v3(self, stream: int) -> bool:
        import ctypes

        self.streams.append(stream)
        batch, tokens = self.shapes["input_ids"]
        ids = np.ctypeslib.as_array((ctypes.c_int64 * (batch * tokens)).from_address(self.addresses["input_ids"]))
        mask = np.ctypeslib.as_array((ctypes.c_int32 * (batch * tokens)).from_address(
            self.addresses["attention_mask"]))
        out = np.ctypeslib.as_array((ctypes.c_float * (batch * tokens * 4)).from_address(
            self.addresses["last_hidden_state"]))
        out[:] = _fake_hidden(ids.reshape(batch, tokens), mask.reshape(batch, tokens)).ravel()
        return True


def _fake_hidden(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.stack([ids % 7, ids % 5, np.ones_like(ids), mask], axis=-1).astype(np.float32)  # (b, t, 4)


def _cpu_engine(minilm_dir: Path, io: dict[str, tuple[str, str]], max_batch_size: int = 8) -> tuple[Any, Any]:
    """The engine with its backend bound to a stand-in TensorRT engine on the CPU; (engine, model io)."""
    torch = pytest.importorskip("torch")
    from sluice.engines.backends.arrays import TorchOps
    from sluice.engines.backends.backend_contract import ModelFiles
    from sluice.engines.tasks.task_contract import TaskContext
    from sluice.engines.torch import placement

    engine = _engine(model="minilm-l6", max_batch_size=max_batch_size, max_length=64)
    fake_trt = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="in", OUTPUT="out"),
                               DataType=SimpleNamespace(FLOAT="f32", INT64="i64", INT32="i32"))
    names = list(io)
    fake_engine = SimpleNamespace(num_io_tensors=len(names), get_tensor_name=names.__getitem__,
                                  get_tensor_mode=lambda n: io[n][0], get_tensor_dtype=lambda n: io[n][1])
    backend = engine.backend
    backend._torch, backend.device = torch, torch.device("cpu")
    model_io = backend.bind_engine(fake_trt, torch, fake_engine)
    backend._staging = placement.HostStaging(torch, backend.device)
    backend.ops = TorchOps(torch, backend.device, backend._staging)
    backend.profile = shape_profile(max_batch_size, 64)
    backend.inference = torch.inference_mode  # the CUDA stream context is the one GPU-only part
    engine.task = engine.task_type.create(engine.task_options, TaskContext(
        engine="tensorrt", files=ModelFiles(directory=minilm_dir, model_path=minilm_dir), max_batch_size=max_batch_size))
    return engine, model_io


def test_infer_binds_shapes_and_addresses_runs_on_the_stream_and_pools(minilm_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from sluice.engines.tasks.text_inputs import pad_batch

    engine, io = _cpu_engine(minilm_dir, {"input_ids": ("in", "i64"), "attention_mask": ("in", "i32"),
                                          "last_hidden_state": ("out", "f32")})
    assert engine.backend._input_dtypes == {"input_ids": torch.int64, "attention_mask": torch.int32}
    assert [spec.dtype for spec in io.inputs] == [np.int64, np.int32]
    engine.task.bind(io)
    engine.backend._stream, engine.backend._context = SimpleNamespace(cuda_stream=1234), _FakeContext()

    items = engine.prepare(["a short one", "a somewhat longer text than the first", ""])
    got = np.asarray(engine.infer(items))  # (3, 4)
    batch = pad_batch(items)
    hidden = _fake_hidden(batch.input_ids, batch.attention_mask)
    mask = batch.attention_mask[:, :, None]
    want = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-6)
    assert engine.backend._context.shapes == {"input_ids": batch.input_ids.shape,
                                              "attention_mask": batch.input_ids.shape}
    assert engine.backend._context.streams == [1234]
    with pytest.raises(ValueError, match="outside the engine's profile"):
        engine.infer(engine.prepare(["x"] * 9))


def test_a_model_with_other_inputs_or_outputs_fails_at_start(minilm_dir: Path) -> None:
    for io, fragment in [({"pixels": ("in", "f32"), "last_hidden_state": ("out", "f32")}, "takes inputs ['pixels']"),
                         ({"input_ids": ("in", "i64"), "logits": ("out", "f32")}, "has outputs ['logits']")]:
        engine, model_io = _cpu_engine(minilm_dir, io)
        with pytest.raises(EngineStartError, match=re.escape(fragment)):
            engine.task.bind(model_io)


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@requires_tensorrt_gpu
def test_tensorrt_embeddings_match_the_cpu_reference_and_the_engine_is_cached(minilm_dir: Path,
                                                                                tmp_path: Path) -> None:
    from sluice.engines.onnx.onnx_engine import ENGINE_TYPE as ONNX_TYPE
    from sluice.engines.onnx.onnx_engine import OnnxOptions

    reference = ONNX_TYPE.factory(OnnxOptions(model="minilm-l6", providers=["cpu"], warmup=False),
                                  EngineContext(max_batch_size=32))
    reference.start()
    texts = varied_texts(200)
    items = reference.prepare(texts)
    want = np.asarray([v for s in range(0, 200, 32) for v in reference.infer(items[s : s + 32])])  # (200, 384)
    engine = _engine(model="minilm-l6", engine_cache_dir=str(tmp_path))
    engine.start()
    assert engine.backend.built and engine.backend.plan_path is not None
    assert engine.backend.plan_path.parent == tmp_path
    got = np.asarray([v for s in range(0, 200, 32) for v in engine.infer(items[s : s + 32])])
    cosines = (got * want).sum(axis=1)
    assert cosines.min() >= 0.999, f"worst cosine {cosines.min():.5f}"
    again = _engine(model="minilm-l6", engine_cache_dir=str(tmp_path))
    again.start()
    assert not again.backend.built and again.backend.plan_path == engine.backend.plan_path
    np.testing.assert_allclose(again.infer(items[:4]), got[:4], atol=1e-4)


def test_the_torch_example_runs_on_tensorrt_by_changing_only_engine_type() -> None:
    from sluice.config import parse_pipeline

    example = Path(__file__).resolve().parents[2] / "examples" / "pipelines" / "embed-reviews-torch.yaml"
    text = example.read_text(encoding="utf-8").replace("  type: torch\n", "  type: tensorrt\n")
    loaded = parse_pipeline(text, environ={})
    assert loaded.pipeline.engine.type == "tensorrt"
    assert isinstance(loaded.engine_options, TensorrtOptions) and loaded.engine_options.model == "minilm-l6"
