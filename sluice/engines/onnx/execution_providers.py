"""Execution providers of the ONNX engine: names, availability, and per-provider options.

Providers are tried in the order the pipeline gives. A name onnxruntime does not know is a start-up error;
one it knows but this build lacks (CUDA on a CPU-only wheel), or one that fails to initialise (no GPU), is
skipped. Falling back along the list is what the list is for (``[tensorrt, cuda, cpu]`` runs anywhere): one
INFO line names the provider used and why those before it were skipped. A WARNING only when no listed
provider could be used and onnxruntime fell back to one the pipeline did not list; none in this build at
all is a start-up error. onnxruntime is passed in, never imported here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sluice.engines.engine_contract import EngineStartError

log = logging.getLogger("sluice.engines.onnx.onnx_engine")

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
    if not chosen:
        raise EngineStartError(f"none of the providers {requested} is available in this onnxruntime build "
                               f"(it has {', '.join(sorted(built_in))})")
    return chosen


def report_providers(requested: list[str], built_in: list[str], used: list[str]) -> None:
    """Log which provider the session runs on when it is not the first one listed (see the module doc)."""
    said = fallback_line(requested, built_in, used)
    if said is not None:
        log.log(*said)


def fallback_line(requested: list[str], built_in: list[str], used: list[str]) -> tuple[int, str] | None:
    """(level, line) about the provider the session runs on (``used[0]``, onnxruntime's choice) and the
    listed ones it skipped; None when it runs on the first one listed."""
    running = used[0] if used else "no provider"
    skipped = requested[:requested.index(running)] if running in requested else list(requested)
    if not skipped:
        return None
    missing = [name for name in skipped if name not in built_in]
    failed = [name for name in skipped if name in built_in]
    reasons = []
    if missing:
        hint = " (onnxruntime-gpu has the GPU providers)" if set(missing) & set(GPU_PROVIDERS) else ""
        reasons.append(f"{', '.join(missing)}: not in this onnxruntime build{hint}")
    if failed:
        reasons.append(f"{', '.join(failed)}: failed to initialise (no usable GPU, or CUDA/cuDNN/TensorRT "
                       "libraries missing)")
    why = "; ".join(reasons)
    if running in requested:
        return logging.INFO, f"onnx engine: runs on {running}, the first listed one usable here; skipped {why}"
    return logging.WARNING, (f"onnx engine: none of the listed providers could be used, onnxruntime fell back to "
                             f"{running}; skipped {why}")


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

    from sluice.model_store import default_cache_dir

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
