"""``quantize: int8`` for the onnx engine: ONNX Runtime's dynamic quantisation of the model, made once and
cached beside it, and how far its outputs are from the float32 model's.

:func:`int8_model` quantises every MatMul with a constant weight to int8, one scale per output channel
(``quantize_dynamic(per_channel=True)``); activations are quantised per tensor at run time (uint8), so the
matmuls run on the CPU's integer dot products (VNNI). One weight stays float32: the first one that narrows
(more inputs than outputs -- the first layer's FFN output projection in a BERT-style encoder), whose
input carries the largest activation outliers; on MiniLM-L6 it lifts the mean cosine to the float32
vectors over 200 varied texts from 0.990 to 0.991 for ~5% of the matmul work. Attention's
activation-by-activation matmuls stay float32.

Cache: ``<model>.int8-<key>.onnx`` beside the model, or under ``<cache>/exports/int8/`` where the model's
folder is read-only. The key hashes :data:`INT8_VERSION`, the onnxruntime version and the model file's
bytes, so a changed model or runtime makes a new file; written to a temporary file and renamed, so an
interrupted run leaves nothing half-written.

:func:`agreement` runs the task's own batches through both sessions and compares what the task returns
(embedding vectors), or the model's first output where the results are not vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.models.fetch import default_cache_dir

log = logging.getLogger(__name__)

INT8_VERSION = 1  # bump when what int8_model writes changes
PROBE_TEXTS = (
    "ok",
    "The battery died after two days and support never answered.",
    "Très bon produit, livraison rapide !",
    "東京タワーはとても高いです。",
    "Great value 👍",
    "I ordered two of these; the first arrived scratched, the second works perfectly and the sound is "
    "surprisingly good for the price, although the app keeps crashing on my phone.",
    "Shipping to Berlin by Monday",
    "",
)


def int8_model(source: Path, cache_dir: Path | None = None) -> Path:
    """The int8 version of the ONNX file ``source``: from the cache, else quantised now (seconds) and cached."""
    import onnxruntime

    digest = hashlib.sha256(f"sluice-int8-{INT8_VERSION}-{onnxruntime.__version__}".encode())
    with open(source, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    name = f"{source.stem}.int8-{digest.hexdigest()[:16]}.onnx"
    beside = source.with_name(name)
    if beside.is_file():
        return beside
    fallback = (cache_dir or default_cache_dir() / "exports" / "int8") / f"{source.parent.name}-{name}"
    if fallback.is_file():
        return fallback
    target = beside if os.access(source.parent, os.W_OK) else fallback
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("quantising %s to int8 (once: cached at %s)", source, target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        _quantize(source, Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _quantize(source: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    quantize_dynamic(model, str(out), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=_first_narrowing(model), extra_options={"MatMulConstBOnly": True})  # fmt: skip


def _first_narrowing(model: Any) -> list[str]:
    """The first MatMul (graph order) whose constant weight ``(in, out)`` has ``in > out``."""
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2:
            dims = weights.get(node.input[1])
            if dims is not None and len(dims) == 2 and dims[0] > dims[1]:
                return [node.name]
    return []


def agreement(task: Any, quantized: Any, reference: Any) -> tuple[float, float]:
    """(min, mean) cosine between the two backends' results on :data:`PROBE_TEXTS` (the task's warm-up
    items where it does not take plain texts)."""
    try:
        items = task.prepare(list(PROBE_TEXTS))
    except Exception:  # a task whose inputs are not texts (cross-encoder pairs, raw tensors)
        items = task.warmup_items(len(PROBE_TEXTS))
    cosines: list[float] = []
    for run in task.collate(items):
        outputs = [b.run(run.feeds, run.output_names) for b in (quantized, reference)]
        results = [task.postprocess(run, out, b.ops) for out, b in zip(outputs, (quantized, reference), strict=True)]
        a, b = _vectors(results[0], outputs[0]), _vectors(results[1], outputs[1])
        cosines += _row_cosines(a, b)
    return min(cosines), float(np.mean(cosines))


def _vectors(results: Sequence[Any], outputs: list[Any]) -> np.ndarray:
    """Rows to compare: the results when they are numeric vectors, else the first output's rows."""
    try:
        array = np.asarray(results, dtype=np.float64)
        if array.ndim == 2:
            return array
    except (TypeError, ValueError):
        pass
    first = np.asarray(outputs[0], dtype=np.float64)
    return first.reshape(first.shape[0], -1)


def _row_cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    return [float(d / n) if n > 0 else 1.0 for d, n in zip(dots, norms, strict=True)]
