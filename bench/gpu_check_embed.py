"""GPU check step: the torch embedding engine on CUDA, fp16 and bf16, on random MiniLM- and BGE-base-shaped
encoders: records/s by batch size against batch 1, and cosine against the same engine on the CPU in fp32.

    python bench/gpu_check_embed.py --out rows.json [--device cuda] [--profile full] [--budget-s 90]

The engine is built through its public engine type (``engine_types.lookup("torch")``: options model and
factory), as a pipeline builds it. Records are review-like texts (``bench/embed_engine.review_texts``),
tokenised in ``prepare`` and batched in length-sorted windows (what ``bucket_by: tokens`` does); only
``infer`` is timed. :func:`measure_engine` also serves the ONNX Runtime / TensorRT rows
(``bench/gpu_check_providers.py``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gpu_check_common import Clock, Rows, child_args
from gpu_check_models import ENCODERS, save_encoder

BATCH_SIZES = {"full": (1, 8, 32, 128, 512), "tiny": (1, 8, 32)}
NUM_TEXTS = {"full": 4096, "tiny": 256}
NUM_PARITY_TEXTS = 200
MAX_S_PER_SIZE = {"full": 4.0, "tiny": 0.5}  # time per batch size (whole windows of 256 records at least)
DTYPES = ("float16", "bfloat16")
MIN_COSINE = {"float16": 0.999, "bfloat16": 0.99, "float32": 0.999}  # bf16 keeps 8 mantissa bits


def start_engine(engine_type: str, options: dict[str, Any], max_batch_size: int) -> Any:
    from sluice.engines import engine_types
    from sluice.engines.engine_contract import EngineContext

    kind = engine_types.lookup(engine_type)
    engine = kind.factory(kind.options(**options), EngineContext(max_batch_size=max_batch_size))
    engine.start()
    return engine


def embed(engine: Any, texts: list[str], batch_size: int = 32) -> Any:
    import numpy as np

    items = engine.prepare(texts)
    vectors = [v for s in range(0, len(items), batch_size) for v in engine.infer(items[s:s + batch_size])]
    return np.asarray(vectors, dtype=np.float32)  # (num_texts, dim), L2-normalised


def measure_engine(rows: Rows, prefix: str, engine: Any, reference: Any, parity_texts: list[str],
                   texts: list[str], batch_sizes: tuple[int, ...], per_size_s: float, min_cosine: float,
                   **about: Any) -> None:
    """Rows ``{prefix} cosine`` and ``{prefix} bs=N`` for a started engine (``about``: extra columns)."""
    from embed_engine import time_batches

    with rows.attempt(f"{prefix} cosine"):
        cosines = (embed(engine, parity_texts) * reference).sum(axis=1)  # both sides unit vectors
        rows.measured(f"{prefix} cosine", "cosine", **about, min_cosine=round(float(cosines.min()), 6),
                      mean_cosine=round(float(cosines.mean()), 6), ok=bool(cosines.min() >= min_cosine),
                      threshold=min_cosine)
    items = engine.prepare(texts)
    base = None
    for size in batch_sizes:
        name = f"{prefix} bs={size}"
        with rows.attempt(name):
            measured = time_batches(engine, items, size, "sorted", budget_s=per_size_s)
            base = measured.records_per_s if size == 1 else base
            rows.measured(name, "throughput", **about, batch=size, records=measured.num_records,
                          records_per_s=round(measured.records_per_s, 1),
                          vs_bs1=None if base is None else round(measured.records_per_s / base, 2),
                          padding_share=round(1 - measured.num_real_tokens / measured.num_padded_tokens, 3))


def main() -> None:
    args = child_args(__doc__.splitlines()[0])
    from embed_engine import review_texts

    clock = Clock(args.budget_s)
    encoders, sizes = ENCODERS[args.profile], BATCH_SIZES[args.profile]
    planned = {f"{e.name} {dt} {what}": kind for e in encoders for dt in DTYPES
               for what, kind in [("cosine", "cosine"), *((f"bs={b}", "throughput") for b in sizes)]}
    rows = Rows(args.out, planned)
    parity_texts = review_texts(NUM_PARITY_TEXTS, seed=1)
    texts = review_texts(NUM_TEXTS[args.profile])
    with tempfile.TemporaryDirectory(prefix="sluice-gpu-embed-") as tmp:
        for i, spec in enumerate(encoders):
            model_dir = save_encoder(spec, Path(tmp) / spec.name, texts)
            options = {"model": str(model_dir), "max_length": 256}
            cpu = start_engine("torch", {**options, "device": "cpu", "dtype": "float32"}, 32)
            reference = embed(cpu, parity_texts)
            cpu.close()
            for j, dtype in enumerate(DTYPES):
                runs_left = (len(encoders) - i) * len(DTYPES) - j
                engine = start_engine("torch", {**options, "device": args.device, "dtype": dtype}, max(sizes))
                per_size_s = min(MAX_S_PER_SIZE[args.profile], clock.left() / runs_left * 0.6 / len(sizes))
                measure_engine(rows, f"{spec.name} {dtype}", engine, reference, parity_texts, texts, sizes,
                               per_size_s=per_size_s, min_cosine=MIN_COSINE[dtype],
                               device=str(getattr(engine, "device", "?")),
                               ran_as=str(getattr(engine, "dtype", "?")).removeprefix("torch."))
                engine.close()


if __name__ == "__main__":
    main()
