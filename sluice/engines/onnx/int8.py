"""``quantize: int8`` for the onnx engine: the model's constant-weight MatMuls rewritten to int8
(:mod:`onnx_int8_graph`: int8 weights per output column, activations quantised per token at run time, the
products on the CPU's integer dot products), made once and cached beside the model, and how far its outputs
are from the float32 model's.

The few matmuls whose rounding damages the outputs most are found end to end on built-in calibration texts
(:mod:`onnx_int8_plan`) and get their input's outlier channels split off to float32, or, where that is not
enough, stay float32. On MiniLM-L6 over 200 varied texts (none of them calibration texts) the cosine to the
float32 vectors is min 0.9928, mean 0.9980 (9 outlier channels of 6 inputs split off, no matmul kept
float32, 10 of 24 inputs on a fixed calibrated scale; 0.9946 / 0.9984 with per-row scales everywhere, at
~12 % less speed). Every matmul plainly int8: min 0.978; ONNX Runtime's ``quantize_dynamic``, which this replaced,
scales activations per tensor, so one outlier channel of one long text cost every short text in its batch
its resolution (min 0.967).

Cache: ``<model>.int8-<key>.onnx`` beside the model, or under ``<cache>/exports/int8/`` where the model's
folder is read-only. The key hashes :data:`INT8_VERSION`, the onnxruntime version, the weights' range (it
depends on the CPU) and the bytes of the model file and of the tokenizer file it was calibrated with, so a
changed model, runtime or CPU kind makes a new file;
written to a temporary file and renamed, so an interrupted run leaves nothing half-written.

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

from sluice.engines.onnx.int8_graph import name_nodes, quantize_matmuls, weight_qmax
from sluice.engines.onnx.int8_plan import PROBE_TEXTS, plan, row_cosines
from sluice.model_store.download import default_cache_dir

log = logging.getLogger(__name__)

INT8_VERSION = 5  # bump when what int8_model writes changes


def int8_model(source: Path, cache_dir: Path | None = None, tokenizer_dir: Path | None = None) -> Path:
    """The int8 version of the ONNX file ``source``: from the cache, else quantised now (seconds) and cached.

    ``tokenizer_dir``: where the model's ``tokenizer.json`` is (default: beside ``source``), for calibration."""
    import onnxruntime

    tokenizer = _tokenizer_file(tokenizer_dir or source.parent)
    # the weights' range depends on the CPU (onnx_int8_graph.weight_qmax): a model quantised for one is not
    # reused on another
    digest = hashlib.sha256(f"sluice-int8-{INT8_VERSION}-{onnxruntime.__version__}-{weight_qmax():g}".encode())
    for path in (source, tokenizer):
        if path is None:
            continue
        with open(path, "rb") as handle:
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
        _quantize(source, Path(tmp), tokenizer)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _tokenizer_file(folder: Path) -> Path | None:
    path = folder / "tokenizer.json"
    return path if path.is_file() else None


def _quantize(source: Path, out: Path, tokenizer: Path | None = None) -> None:
    import onnx

    model = onnx.load(str(source))
    name_nodes(model)  # the plan and the rewrite pick matmuls by node name
    chosen = plan(model, tokenizer)
    count = quantize_matmuls(model, set(chosen.quantise), chosen.outliers, chosen.static)
    log.info("int8: %d of %d constant-weight matmuls quantised, %d outlier channels of %d of their inputs computed "
             "in float32 beside them; kept float32: %s; %d inputs with a fixed scale", count, count + len(chosen.kept),
             sum(map(len, chosen.outliers.values())), len(chosen.outliers), ", ".join(chosen.kept) or "none",
             len(chosen.static))
    onnx.save(model, str(out))


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
        cosines += row_cosines(a, b)
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
