"""Execution providers of the ONNX engine: names, availability, and per-provider options.

Providers are tried in the order the pipeline gives. A name onnxruntime does not know is a start-up error;
one it knows but this build lacks (CUDA on a CPU-only wheel), or one that fails to initialise (no GPU), is
skipped with a warning saying why. onnxruntime is passed in, never imported here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sluice.engines.base import EngineStartError

log = logging.getLogger("sluice.engines.onnx")

SHORT_NAMES = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
DEFAULT_PROVIDERS = list(SHORT_NAMES.values())
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def full_name(name: str) -> str:
    """``cuda`` -> ``CUDAExecutionProvider``; full names pass unchanged. ValueError for anything else."""
    if name.lower() in SHORT_NAMES:
        return SHORT_NAMES[name.lower()]
    if name.endswith("ExecutionProvider"):
        return name  # checked against the installed onnxruntime at start
    raise ValueError(f"unknown provider {name!r}; expected one of {sorted(SHORT_NAMES)} "
                     "or a full onnxruntime name such as 'CUDAExecutionProvider'")


def available_providers(ort: Any, requested: list[str]) -> list[str]:
    """The requested providers this onnxruntime build has, in order. EngineStartError when none or unknown."""
    known = set(ort.get_all_providers())
    built_in = set(ort.get_available_providers())
    chosen = []
    for name in requested:
        if name not in known:
            raise EngineStartError(f"unknown execution provider {name!r}; onnxruntime knows "
                                   f"{', '.join(sorted(known))}")
        if name in built_in:
            chosen.append(name)
        else:
            log.warning("onnx engine: %s is not in this onnxruntime build (it has %s); skipped%s", name,
                        ", ".join(sorted(built_in)),
                        " -- install onnxruntime-gpu for GPU providers" if name in GPU_PROVIDERS else "")
    if not chosen:
        raise EngineStartError(f"none of the providers {requested} is available in this onnxruntime build "
                               f"(it has {', '.join(sorted(built_in))})")
    return chosen


def warn_uninitialised(chosen: list[str], used: list[str]) -> None:
    """Warn about providers the session silently dropped (onnxruntime falls back instead of failing)."""
    for name in chosen:
        if name not in used:
            log.warning("onnx engine: %s is in this onnxruntime build but failed to initialise "
                        "(no usable GPU, or CUDA/cuDNN/TensorRT libraries missing); skipped", name)


def with_options(providers: list[str], model_file: Path, *, max_batch_size: int, max_length: int,
                 token_inputs: bool) -> list[Any]:
    """Provider entries for the session; TensorRT gets one shape profile covering every batch.

    Without explicit profiles TensorRT rebuilds its engine whenever a longer batch arrives (tens of seconds
    each); with (1 x 1) .. (max_batch_size x max_length) it builds once, cached on disk. Only for models
    whose inputs are all (batch, tokens) (``token_inputs``). Exercised only on a GPU machine with TensorRT.
    """
    if "TensorrtExecutionProvider" not in providers or not token_inputs:
        return list(providers)
    import onnx

    from sluice.models import default_cache_dir

    graph = onnx.load(str(model_file), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    names = [i.name for i in graph.input if i.name not in initializers]

    def shapes(batch: int, tokens: int) -> str:
        return ",".join(f"{name}:{batch}x{tokens}" for name in names)

    trt_options = {
        "trt_profile_min_shapes": shapes(1, 1),
        "trt_profile_opt_shapes": shapes(max_batch_size, min(max_length, 128)),
        "trt_profile_max_shapes": shapes(max_batch_size, max_length),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(default_cache_dir() / "onnx-tensorrt"),
    }
    return [("TensorrtExecutionProvider", trt_options) if name == "TensorrtExecutionProvider" else name
            for name in providers]
