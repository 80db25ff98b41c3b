"""``quantize: int8`` for the onnx engine: ONNX Runtime's dynamic quantisation of the model, made once and
cached beside it, and how far its outputs are from the float32 model's.

:func:`int8_model` quantises every MatMul with a constant weight to int8, one scale per output channel
(``quantize_dynamic(per_channel=True)``); activations are quantised per tensor at run time (uint8), so the
matmuls run on the CPU's integer dot products (VNNI). One weight stays float32: the first one that narrows
(more inputs than outputs -- the first layer's FFN output projection in a BERT-style encoder), whose
input carries the largest activation outliers, for ~5% of the matmul work. Keeping every narrowing weight
float32 (all the FFN output projections, whose post-GELU inputs are the hardest to quantise per tensor)
would lift MiniLM-L6's lowest cosine from 0.986 to 0.990 but cost a third of the int8 speed-up (1.42x ->
1.27x the float32 model on one Xeon). Attention's activation-by-activation matmuls stay float32.

Before quantising, each of those matmuls is *smoothed* (SmoothQuant, Xiao et al. 2023): a few input
channels of a transformer's activations carry values far larger than the rest, and one int8 scale per
tensor spends its range on them, so the short texts of a stream (a handful of tokens) lose most of their
signal. Channel ``j`` of the input is divided by ``s_j = amax(x_j)^a / amax(W_j)^(1 - a)`` (a ``Mul``
node before the matmul) and row ``j`` of the weight multiplied by it -- the same product in float32, with
the outliers moved into the weight, which is quantised per output channel. ``amax(x_j)`` comes from running
the float32 model on :data:`CALIBRATION_TEXTS` tokenised by the model's own ``tokenizer.json`` (no user
data; a text model's outlier channels are the model's, not the text's), or on random token ids where there
is no tokenizer file; ``a = SMOOTHING``. On MiniLM-L6 over 200 varied texts (none of them calibration
texts) it lifts the lowest cosine to the float32 vectors from 0.967 to 0.986 and the mean from 0.991 to
0.995 (random ids: 0.971 / 0.994), for about 6 % of the speed (the ``Mul`` nodes; a BERT-style encoder's
LayerNorm outputs also feed its residual stream, so they cannot be folded into the LayerNorms). A model whose
inputs are not token ids, or that the calibration cannot run, is quantised without smoothing.

Cache: ``<model>.int8-<key>.onnx`` beside the model, or under ``<cache>/exports/int8/`` where the model's
folder is read-only. The key hashes :data:`INT8_VERSION`, the onnxruntime version and the bytes of the
model file and of the tokenizer file it was calibrated with, so a changed model or runtime makes a new file;
written to a temporary file and renamed, so an interrupted run leaves nothing half-written.

:func:`agreement` runs the task's own batches through both sessions and compares what the task returns
(embedding vectors), or the model's first output where the results are not vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.models.fetch import default_cache_dir

log = logging.getLogger(__name__)

INT8_VERSION = 2  # bump when what int8_model writes changes
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


CALIBRATION_TEXTS = PROBE_TEXTS + (
    "Hello world.", "Where is my order #4411? It was due last week and nobody replies to email.",
    "¿Dónde está la estación?", "5 stars", "Die Lieferung kam zu spät, aber der Kundendienst war freundlich.",
    "no", "Why??", "The quick brown fox jumps over the lazy dog near the river bank at dawn.", "价格合理，质量很好。",
    "Terrible. Do not buy.", "Refund pls", "Thanks!",
)


def int8_model(source: Path, cache_dir: Path | None = None, tokenizer_dir: Path | None = None) -> Path:
    """The int8 version of the ONNX file ``source``: from the cache, else quantised now (seconds) and cached.

    ``tokenizer_dir``: where the model's ``tokenizer.json`` is (default: beside ``source``), for calibration."""
    import onnxruntime

    tokenizer = _tokenizer_file(tokenizer_dir or source.parent)
    digest = hashlib.sha256(f"sluice-int8-{INT8_VERSION}-{onnxruntime.__version__}".encode())
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
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    excluded = _narrowing(model)[:1]
    _smooth(model, skip=set(excluded), tokenizer=tokenizer)
    quantize_dynamic(model, str(out), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=excluded, extra_options={"MatMulConstBOnly": True})  # fmt: skip


SMOOTHING = 0.65  # SmoothQuant's migration strength a; 0.6-0.7 were best on MiniLM-L6, 0.5 and 0.8 worse
CALIBRATION_LENGTHS = (3, 5, 8, 16, 32, 64, 128)  # tokens per random calibration sequence (two of each)


def _smooth(model: Any, skip: set[str], tokenizer: Path | None = None) -> int:
    """Smooth every MatMul with a constant 2-D weight (but those in ``skip``) in place; how many were."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in model.graph.initializer if len(t.dims) == 2}
    uses = Counter(name for n in model.graph.node for name in n.input)
    # a weight read by more than one node (tied) cannot take one matmul's factors without changing the others
    targets = [n for n in model.graph.node if n.op_type == "MatMul" and len(n.input) == 2 and n.name not in skip
               and n.input[1] in weights and uses[n.input[1]] == 1]  # fmt: skip
    amax = _input_amax(model, sorted({n.input[0] for n in targets}), _calibration_ids(model, tokenizer))
    if amax is None:
        return 0
    muls: dict[str, Any] = {}  # MatMul name -> the Mul node that goes right before it
    for node in targets:
        x_max = amax.get(node.input[0])
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)  # (in, out)
        if x_max is None or x_max.shape != (w.shape[0],):
            continue
        factor = np.maximum(x_max, 1e-5) ** SMOOTHING / np.maximum(np.abs(w).max(axis=1), 1e-5) ** (1 - SMOOTHING)
        factor = np.clip(factor, 1e-2, 1e2).astype(np.float32)
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(w * factor[:, None], node.input[1]))
        inverse = numpy_helper.from_array(1.0 / factor, f"{node.name}/smooth_inverse")
        model.graph.initializer.append(inverse)
        mul = helper.make_node("Mul", [node.input[0], inverse.name], [f"{node.name}/smoothed"], name=f"{node.name}/smooth")
        node.input[0] = mul.output[0]
        muls[node.name] = mul
    if muls:  # one rebuild of the node list, each Mul just before its MatMul (topological order kept)
        nodes = [new for node in model.graph.node for new in ((muls[node.name], node) if node.name in muls else (node,))]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return len(muls)


def _calibration_ids(model: Any, tokenizer: Path | None) -> list[np.ndarray] | None:
    """Token id rows ``(1, length)`` to calibrate on: the calibration texts through the model's tokenizer, else
    random ids (two rows per length in ``CALIBRATION_LENGTHS``); None when the model's vocabulary is unknown."""
    if tokenizer is not None:
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tokenizer))
            tok.no_padding()
            tok.enable_truncation(512)
            return [np.asarray([e.ids], dtype=np.int64) for e in tok.encode_batch(list(CALIBRATION_TEXTS))]
        except Exception as err:  # noqa: BLE001 -- an unreadable tokenizer only costs the better calibration
            log.info("int8 calibration: cannot use %s (%s); calibrating on random token ids", tokenizer, err)
    vocab = _vocab_size(model)
    if vocab is None:
        return None
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, size=(2, length), dtype=np.int64) for length in CALIBRATION_LENGTHS]


def _input_amax(model: Any, tensors: list[str], calibration: list[np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """Per-channel max |value| of ``tensors`` over the ``calibration`` id rows, from the float32 model; None
    when its inputs are not token ids (no calibration input can be made) or the calibration run fails."""
    import onnx
    import onnxruntime
    from onnx import helper

    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    if "input_ids" not in inputs or calibration is None or any(t != onnx.TensorProto.INT64 for t in inputs.values()):
        return None
    taken = set(inputs) | {o.name for o in model.graph.output}  # already visible: not added as outputs again
    tensors = [t for t in tensors if t not in taken]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in tensors:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    amax: dict[str, np.ndarray] = {}
    try:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for ids in calibration:
            feeds = {name: ids if name == "input_ids" else
                     (np.ones_like(ids) if name == "attention_mask" else np.zeros_like(ids)) for name in inputs}  # fmt: skip
            for name, value in zip(tensors, session.run(tensors, feeds), strict=True):
                channel_max = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
                amax[name] = np.maximum(amax[name], channel_max) if name in amax else channel_max
    except Exception as err:  # noqa: BLE001 -- onnxruntime's own errors: the model still quantises, unsmoothed
        log.warning("int8 calibration failed (%s); quantising without smoothing", str(err).strip().splitlines()[:1])
        return None
    return amax


def _vocab_size(model: Any) -> int | None:
    """Rows of the embedding table that ``input_ids`` indexes (the Gather reading it)."""
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            dims = tables.get(node.input[0])
            if dims:
                return int(dims[0])
    return None


def _narrowing(model: Any) -> list[str]:
    """The MatMuls whose constant weight ``(in, out)`` has ``in > out``."""
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    narrowing = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2:
            dims = weights.get(node.input[1])
            if dims is not None and len(dims) == 2 and dims[0] > dims[1]:
                narrowing.append(node.name)
    return narrowing


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
