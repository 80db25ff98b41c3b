"""Pure decisions of the ``tensorrt`` engine: what is missing, the shape profile, the engine cache key.

No TensorRT, torch or CUDA here, so all of it is tested on any machine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

TENSORRT_MISSING = "the 'tensorrt' package is not installed (pip install tensorrt on a machine with an NVIDIA GPU)"
TORCH_MISSING = "the 'torch' package is not installed (the engine keeps its device buffers in torch tensors)"
GPU_MISSING = "no NVIDIA GPU visible (torch.cuda.is_available() is False / no CUDA driver)"
DEFAULT_OPT_TOKENS = 128  # typical padded length of a review-sized text batch


def missing_requirements(*, has_gpu: bool, has_tensorrt: bool, has_torch: bool = True) -> str | None:
    """The one-line start-up error naming everything missing, or None when the engine can start.

    The GPU comes first: without one, installing packages would not help.
    """
    missing = [text for text, ok in ((GPU_MISSING, has_gpu), (TENSORRT_MISSING, has_tensorrt),
                                     (TORCH_MISSING, has_torch)) if not ok]
    return "engine tensorrt: " + "; ".join(missing) if missing else None


@dataclass(frozen=True, slots=True)
class ShapeProfile:
    """One TensorRT optimisation profile over (batch, tokens) inputs: every batch shape must fit in min..max."""

    min_shape: tuple[int, int]  # (batch, tokens)
    opt_shape: tuple[int, int]  # the shape TensorRT tunes its kernels for
    max_shape: tuple[int, int]

    def fits(self, batch: int, tokens: int) -> bool:
        return (self.min_shape[0] <= batch <= self.max_shape[0]
                and self.min_shape[1] <= tokens <= self.max_shape[1])


def shape_profile(max_batch_size: int, max_length: int, opt_tokens: int | None = None) -> ShapeProfile:
    """The profile from the pipeline's batching settings: (1, 1) .. (max_batch_size, max_length).

    The batcher never hands the engine more than ``max_batch_size`` items and the tokenizer truncates to
    ``max_length``, so no batch falls outside. The optimum is half the largest batch at a typical length
    (``opt_tokens``, default 128, capped by ``max_length``): under load batches are large but seldom full.
    """
    if max_batch_size < 1 or max_length < 1:
        raise ValueError(f"max_batch_size and max_length must be >= 1, got {max_batch_size}, {max_length}")
    tokens = min(max_length, opt_tokens or DEFAULT_OPT_TOKENS)
    return ShapeProfile(min_shape=(1, 1), opt_shape=(max(1, max_batch_size // 2), max(1, tokens)),
                        max_shape=(max_batch_size, max_length))


def engine_cache_key(*, model_sha256: str, tensorrt_version: str, gpu_name: str, profile: ShapeProfile,
                     fp16: bool) -> str:
    """A hex key naming one serialised engine: any change that makes a cached engine invalid changes it.

    A TensorRT plan only loads on the TensorRT version and GPU model that built it, and only accepts
    shapes in its profile; the model bytes and the precision decide what it computes.
    """
    fields = {"model": model_sha256, "tensorrt": tensorrt_version, "gpu": gpu_name,
              "profile": asdict(profile), "fp16": fp16}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def engine_file_name(model_path: Path, key: str) -> str:
    """``<model stem>-<key>.plan``: readable in a listing, unique per key."""
    return f"{model_path.stem}-{key}.plan"


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
