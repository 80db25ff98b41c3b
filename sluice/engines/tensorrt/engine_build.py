"""Build a TensorRT engine from an ONNX model, or load the one built before from the on-disk cache.

Guarantees of :func:`load_or_build`:

* **One build per (model, TensorRT version, GPU, profile, precision).** The serialised engine is stored
  under :func:`sluice.engines.tensorrt.build_plan.engine_cache_key`; a later start deserialises it in a second
  instead of rebuilding for tens of seconds.
* **No torn cache files.** The plan is written to a temporary file and renamed into place; a cached plan
  that does not deserialise (corrupt, or made by another build of TensorRT) is rebuilt and replaced.
* **One-line errors** (:class:`EngineStartError`) for parse and build failures.

``trt`` (the imported tensorrt module) is passed in; nothing here imports it. Exercised only on a GPU
machine with TensorRT (tests/engines/test_tensorrt.py, bench/gpu_check.sh).
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tensorrt.build_plan import ShapeProfile, engine_cache_key, engine_file_name, file_sha256

log = logging.getLogger("sluice.engines.tensorrt.tensorrt_engine")


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """What one engine is built from."""

    onnx_path: Path
    profile: ShapeProfile  # applied to every (batch, tokens) input of the model
    fp16: bool  # TensorRT 10's FP16 builder flag (TensorRT 11 takes the precision from the model)
    workspace_bytes: int  # builder scratch memory cap
    gpu_name: str  # part of the cache key: a plan only runs on the GPU model that built it
    cache_dir: Path


@dataclass(frozen=True, slots=True)
class LoadedEngine:
    engine: Any  # trt.ICudaEngine
    runtime: Any  # trt.Runtime; must outlive the engine
    plan_path: Path
    built: bool  # False when it came from the cache


def load_or_build(trt: Any, request: BuildRequest) -> LoadedEngine:
    """The deserialised engine for ``request``: from the cache when there, else built and cached."""
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    key = engine_cache_key(model_sha256=file_sha256(request.onnx_path), tensorrt_version=trt.__version__,
                           gpu_name=request.gpu_name, profile=request.profile, fp16=request.fp16)
    plan_path = request.cache_dir / engine_file_name(request.onnx_path, key)
    if plan_path.is_file():
        engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if engine is not None:
            log.info("engine tensorrt: loaded cached engine %s", plan_path)
            return LoadedEngine(engine=engine, runtime=runtime, plan_path=plan_path, built=False)
        log.warning("engine tensorrt: cached engine %s does not load; rebuilding it", plan_path)
    log.info("engine tensorrt: building an engine for %s (once per model, GPU and TensorRT version)",
             request.onnx_path.name)
    plan = build_plan(trt, logger, request)
    _write_atomically(plan_path, plan)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise EngineStartError(f"engine tensorrt: the engine just built for {request.onnx_path.name} "
                               "does not deserialise (see the TensorRT log above)")
    return LoadedEngine(engine=engine, runtime=runtime, plan_path=plan_path, built=True)


def build_plan(trt: Any, logger: Any, request: BuildRequest) -> bytes:
    """Parse the ONNX file and build a serialised engine with one optimisation profile."""
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode of TensorRT >= 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(request.onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        first = errors[0].splitlines()[0] if errors else "unknown parser error"
        raise EngineStartError(f"engine tensorrt: TensorRT cannot parse {request.onnx_path.name}: {first}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, request.workspace_bytes)
    if request.fp16:
        flag = getattr(trt.BuilderFlag, "FP16", None)
        if flag is None:  # TensorRT 11 removed weak typing: precision comes from the model's own types
            raise EngineStartError(f"engine tensorrt: fp16: true needs TensorRT 10 (this is {trt.__version__}, "
                                   "which builds strongly typed networks only); convert the ONNX model to fp16 "
                                   "first (e.g. ModelOpt AutoCast) and set fp16: false")
        config.set_flag(flag)

    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        if len(tensor.shape) != 2:
            raise EngineStartError(f"engine tensorrt: input {tensor.name!r} has shape {tuple(tensor.shape)}; "
                                   "text tasks feed (batch, tokens) inputs")
        profile.set_shape(tensor.name, request.profile.min_shape, request.profile.opt_shape,
                          request.profile.max_shape)
    config.add_optimization_profile(profile)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineStartError(f"engine tensorrt: TensorRT could not build an engine for "
                               f"{request.onnx_path.name} (see the TensorRT log above)")
    return bytes(memoryview(serialized))


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError as err:  # an unwritable cache costs the next start a rebuild, nothing more
        log.warning("engine tensorrt: cannot cache the engine at %s (%s); the next start rebuilds it",
                    path, err.strerror or err)
