"""GPU check step: ONNX Runtime's CUDA and TensorRT providers and native TensorRT, where they can run.

    python bench/gpu_check_providers.py --out rows.json [--device cuda] [--profile full] [--budget-s 40]

None of them can be installed on the GPU machine: its onnxruntime is the CPU build, it has no TensorRT,
and a call carries 64 MiB at most while their wheels are far larger (:data:`WHEELS`, read off the package
index with ``bash bench/gpu_wheels.sh --provider-sizes``). Each row is therefore measured where the
runtime is present (cosine against the torch engine on the CPU, records/s at a few batch sizes, on an
ONNX export of a random MiniLM-shaped encoder) and otherwise says why not, with the wheel sizes. The
``onnx cpu`` row always runs: the export and the ONNX engine's path, and a CPU baseline.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from gpu_check_common import Clock, Rows, child_args, one_line
from gpu_check_embed import MAX_S_PER_SIZE, NUM_PARITY_TEXTS, embed, measure_engine, start_engine
from gpu_check_models import ENCODERS, save_encoder

# What `bash bench/gpu_wheels.sh --provider-sizes` printed (CPython 3.12, manylinux x86-64).
WHEELS = {
    "onnxruntime-gpu": "onnxruntime-gpu 1.31.1 is a 255.6 MB wheel",
    "tensorrt": ("its libraries (tensorrt-cu13-libs 11.4.0.106) are on the package index only as a 15 kB "
                 "stub that fetches them from pypi.nvidia.com at install time: nothing to carry, and that "
                 "machine reaches no network"),
}
LIMIT = "a call carries 64 MiB at most"
BATCH_SIZES = {"full": (1, 32, 128), "tiny": (1, 8)}


def _ort_providers() -> tuple[str, list[str]]:
    import onnxruntime

    providers = list(onnxruntime.get_available_providers())  # what the build has, fixed per build
    if "CUDAExecutionProvider" in providers and hasattr(onnxruntime, "preload_dlls"):
        try:
            onnxruntime.preload_dlls()  # CUDA/cuDNN libraries from torch's nvidia-* wheels
        except Exception as err:  # the engine's start then says what is missing
            print(f"onnxruntime.preload_dlls: {one_line(err)}", file=sys.stderr)
    return onnxruntime.__version__, providers


def availability() -> dict[str, tuple[dict[str, Any] | None, str]]:
    """Row name -> (engine type and options besides the model, or None; why not / what it is)."""
    found: dict[str, tuple[dict[str, Any] | None, str]] = {}
    try:
        version, providers = _ort_providers()
    except ImportError as err:
        version, providers = "missing", []
        found["onnx cpu"] = (None, f"onnxruntime does not import: {one_line(err)}")
    else:
        found["onnx cpu"] = ({"type": "onnx", "providers": ["cpu"]}, f"onnxruntime {version}")
    for name, provider, short in (("onnx cuda", "CUDAExecutionProvider", ["cuda"]),
                                  ("onnx tensorrt", "TensorrtExecutionProvider", ["tensorrt", "cuda"])):
        if provider in providers:
            found[name] = ({"type": "onnx", "providers": short}, f"onnxruntime {version}")
        else:
            found[name] = (None, f"onnxruntime {version} here has no {provider} (providers {providers}); "
                                 f"{WHEELS['onnxruntime-gpu']}, and {LIMIT}")
    try:
        import tensorrt
    except ImportError:
        found["tensorrt native"] = (None, f"tensorrt is not installed here; {WHEELS['tensorrt']}")
    else:
        found["tensorrt native"] = ({"type": "tensorrt"}, f"tensorrt {tensorrt.__version__}")
    return found


def main() -> None:
    args = child_args(__doc__.splitlines()[0])
    from embed_engine import review_texts

    from sluice.model_store.export import export_encoder_to_onnx

    clock = Clock(args.budget_s)
    sizes = BATCH_SIZES[args.profile]
    found = availability()
    rows = Rows(args.out, {f"{name} {what}": kind for name in found
                           for what, kind in [("cosine", "cosine"), *((f"bs={b}", "throughput") for b in sizes)]})
    runnable = {name: spec for name, (spec, _) in found.items() if spec is not None}
    for name, (spec, why) in found.items():
        if spec is None:
            for row in rows.all():
                if row["name"].startswith(f"{name} "):
                    rows.reason(row["name"], why)
    if not runnable:
        return
    encoder = ENCODERS[args.profile][0]  # MiniLM-shaped on the GPU
    parity_texts = review_texts(NUM_PARITY_TEXTS, seed=1)
    texts = review_texts(1024 if args.profile == "full" else 128)
    with tempfile.TemporaryDirectory(prefix="sluice-gpu-providers-") as tmp:
        model_dir = save_encoder(encoder, Path(tmp) / encoder.name, texts)
        cpu = start_engine("torch", {"model": str(model_dir), "device": "cpu", "dtype": "float32"}, 32)
        reference = embed(cpu, parity_texts)
        cpu.close()
        export_encoder_to_onnx(model_dir, model_dir / "model.onnx")
        for i, (name, spec) in enumerate(runnable.items()):
            options = {k: v for k, v in spec.items() if k != "type"} | {"model": str(model_dir)}
            if spec["type"] == "tensorrt":
                options["engine_cache_dir"] = str(Path(tmp) / "tensorrt")  # not the user cache dir
            try:
                engine = start_engine(spec["type"], options, max(sizes))
            except Exception as err:  # a runtime that imports but cannot start: the reason for its rows
                for row in rows.all():
                    if row["name"].startswith(f"{name} "):
                        rows.reason(row["name"], f"did not start: {one_line(err)}")
                continue
            per_size_s = min(MAX_S_PER_SIZE[args.profile], clock.left() / (len(runnable) - i) * 0.6 / len(sizes))
            measure_engine(rows, name, engine, reference, parity_texts, texts, sizes, per_size_s=per_size_s,
                           min_cosine=0.999,
                           runtime=found[name][1], providers=str(getattr(engine, "providers_used", "-")))
            engine.close()


if __name__ == "__main__":
    main()
