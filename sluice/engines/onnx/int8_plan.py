"""Which matmuls of an ONNX model the int8 rewrite (:mod:`onnx_int8_graph`) treats with care, found end to end
on calibration inputs.

Per-token int8 is good for most matmuls; a few damage the model's outputs out of proportion, nearly always
because a handful of their input's channels carry values ten to twenty times the others' (on MiniLM-L6,
channel 99 of the LayerNorm outputs): a row's scale is set by its outlier, and every other channel is
rounded to a few steps. :func:`plan` finds them and picks, for each, the cheapest remedy that works:

1. *Damage*: each candidate is quantised alone and the model run on the calibration rows; its damage is one
   minus the lowest cosine to the float32 outputs, over rows and over three views of each output (every
   value, the mean over the sequence, the first position: what per-token, mean-pooling and CLS-pooling
   tasks read). Damage is *material* above :data:`MATERIAL_SHARE` of the summed damage and above
   :data:`MATERIAL_LOSS`. A matmul's own output error says little: on MiniLM-L6 the worst are the last
   layers' attention *value* projections, whose errors reach the pooled vector undamped.
2. *Split outliers*: a material matmul whose input has outlier channels (peak over the calibration rows above
   :data:`OUTLIER_RATIO` times the channels' median peak; at most :data:`MAX_OUTLIERS`) gets them split off:
   they are computed in float32 beside the int8 product (LLM.int8()'s decomposition, with static channels).
   On MiniLM-L6 this cuts the worst damage twentyfold, for one or two channels each.
3. *Keep float32*: a matmul still material after the split stays float32, the most damaging first, within
   :data:`KEEP_FLOAT_SHARE` of the weight elements.
4. *Fixed scales*: an input of the int8 matmuls whose one calibrated scale (its peak over the channels not
   split off) costs less than :data:`STATIC_LOSS` alone gets it in place of per-row scales, the cheapest
   first, as many as together still cost less: the reductions and rescales go, and the bias folds into the
   GEMM. On MiniLM-L6 10 of 24 inputs (the first layers' LayerNorm outputs, most attention outputs), ~12 %
   faster at 64 tokens, at min cosine 0.9928 against 0.9946 on 200 varied texts.

Calibration rows: :data:`CALIBRATION_TEXTS` (built-in, never user data) through the model's own
``tokenizer.json``, or random token ids where there is none. A model whose inputs are not token ids, or that
the calibration cannot run, gets the plain plan: every matmul int8, nothing split, per-row scales. The
calibration runs once per model (cached with the rewritten model) and its cost grows with the matmuls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.engine_contract import first_line
from sluice.engines.onnx.int8_graph import QMAX, Candidate, candidates, quantize_matmuls

log = logging.getLogger(__name__)

MATERIAL_SHARE = 0.05  # of the summed damage: below it a matmul is never worth a remedy
MATERIAL_LOSS = 1e-3  # nor below this cosine loss (MiniLM-L6: its material ones cost 0.002-0.005)
OUTLIER_RATIO = 6.0  # a channel whose peak is this many times the median channel peak is an outlier
MAX_OUTLIERS = 8  # channels split off one input at most (beyond that the input is not "a few outliers")
KEEP_FLOAT_SHARE = 0.15  # of the candidates' weight elements at most kept float32 (their matmul work)
STATIC_LOSS = 5e-4  # cosine loss fixed activation scales may add, each alone and all of them together
CALIBRATION_LENGTHS = (3, 5, 8, 16, 32, 64, 128)  # tokens per random calibration sequence (two of each)
PROBE_TEXTS = (  # what the engine's start-up agreement check runs: short, long, several scripts, emoji, empty
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


@dataclass(frozen=True)
class Plan:
    """What :func:`~onnx_int8_graph.quantize_matmuls` is given: the matmuls to rewrite, the outlier channels
    to split off per input tensor, the inputs quantised with a fixed scale (and the scale), and (for the log)
    the matmuls kept float32 and each one's damage."""

    quantise: frozenset[str]
    outliers: dict[str, list[int]] = field(default_factory=dict)
    kept: tuple[str, ...] = ()
    damage: dict[str, float] = field(default_factory=dict)
    static: dict[str, float] = field(default_factory=dict)


def plan(model: Any, tokenizer: Path | None) -> Plan:
    """The plan for ``model`` (read only), calibrated with ``tokenizer`` (a ``tokenizer.json``) or random ids."""
    found = candidates(model)
    everything = Plan(frozenset(c.name for c in found))
    calibration = calibration_ids(model, tokenizer)
    if calibration is None or not found:
        return everything
    try:
        return _plan(model, found, calibration)
    except Exception as err:  # noqa: BLE001 -- onnxruntime's own errors: the model still quantises, all of it
        log.warning("int8 calibration failed (%s); quantising every matmul", first_line(err))
        log.debug("int8 calibration failure", exc_info=True)
        return everything


def _plan(model: Any, found: list[Candidate], calibration: list[np.ndarray]) -> Plan:
    reference = _views(model, calibration)

    def damage_of(name: str, outliers: dict[str, list[int]]) -> float:
        return _damage(model, {name}, outliers, {}, calibration, reference)

    damage = {c.name: damage_of(c.name, {}) for c in found}
    floor = max(MATERIAL_SHARE * sum(damage.values()), MATERIAL_LOSS)
    material = [c for c in sorted(found, key=lambda c: -damage[c.name]) if damage[c.name] >= floor]
    reads = {node.name: node.input[0] for node in model.graph.node if node.input}
    peaks = input_peaks(model, calibration, {reads[c.name] for c in found})  # one pass for the split and step 4
    channels = outlier_channels({reads[c.name]: peaks[reads[c.name]] for c in material})
    outliers = {reads[c.name]: channels[reads[c.name]] for c in material if channels.get(reads[c.name])}
    after = {c.name: damage_of(c.name, outliers) if reads[c.name] in outliers else damage[c.name] for c in material}
    budget = KEEP_FLOAT_SHARE * sum(c.elements for c in found)
    kept: list[str] = []
    for c in sorted(material, key=lambda c: -after[c.name]):
        if after[c.name] < floor or c.elements > budget:
            break
        kept.append(c.name)
        budget -= c.elements
    quantise = frozenset(c.name for c in found) - set(kept)
    inputs = {reads[name]: peaks[reads[name]] for name in quantise}
    static = static_scales(model, quantise, outliers, inputs, calibration, reference)
    return Plan(quantise, outliers, tuple(kept), damage, static)


def static_scales(model: Any, names: frozenset[str], outliers: dict[str, list[int]], peaks: dict[str, np.ndarray],
                  calibration: list[np.ndarray], reference: list[list[np.ndarray]]) -> dict[str, float]:
    """The inputs (``peaks``: each one's channel peaks on the calibration rows) of the matmuls ``names`` that
    can take one fixed scale for every row (their peak over the channels not split off, / 127) and the scale:
    those whose fixed scale adds less than :data:`STATIC_LOSS` to the damage alone, the cheapest first, as
    many as together still add less."""

    def damage(static: dict[str, float]) -> float:
        return _damage(model, set(names), outliers, static, calibration, reference)

    scales = {x: float(np.delete(p, outliers.get(x, [])).max(initial=0.0)) / QMAX for x, p in sorted(peaks.items())}
    plain = damage({})
    cost = {x: damage({x: s}) - plain for x, s in scales.items() if s > 0}
    chosen = sorted((x for x, c in cost.items() if c < STATIC_LOSS), key=cost.__getitem__)
    while chosen and damage({x: scales[x] for x in chosen}) - plain >= STATIC_LOSS:
        chosen.pop()  # the costliest goes back to per-row scales
    return {x: scales[x] for x in chosen}


def _damage(model: Any, names: set[str], outliers: dict[str, list[int]], static: dict[str, float],
            calibration: list[np.ndarray], reference: list[list[np.ndarray]]) -> float:
    """1 - the lowest cosine to the float32 views when the matmuls ``names`` are rewritten (a copy)."""
    import onnx

    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    quantize_matmuls(rewritten, names, outliers, static)
    return 1.0 - _lowest_cosine(_views(rewritten, calibration), reference)


def input_peaks(model: Any, calibration: list[np.ndarray], tensors: set[str]) -> dict[str, np.ndarray]:
    """Per tensor named in ``tensors``, each channel's (last axis) largest magnitude over the calibration rows."""
    import onnx
    from onnx import TensorProto, helper

    if not tensors:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = sorted(tensors)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    session = _session(probe)
    peaks: dict[str, np.ndarray] = {}
    for ids in calibration:
        for name, value in zip(names, session.run(names, _feeds(session, ids)), strict=True):
            peak = np.abs(np.asarray(value)).reshape(-1, value.shape[-1]).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    return peaks


def outlier_channels(peaks: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Per tensor, its outlier channels: peak above :data:`OUTLIER_RATIO` x the median channel peak, the
    :data:`MAX_OUTLIERS` largest at most, in channel order."""
    found = {}
    for name, peak in peaks.items():
        median = float(np.median(peak))
        order = [int(i) for i in np.argsort(-peak, kind="stable")[:MAX_OUTLIERS]]
        found[name] = sorted(i for i in order if median > 0 and peak[i] > OUTLIER_RATIO * median)
    return found


def _session(model: Any) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC  # quick to build
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(session: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Token ids, an all-ones attention mask, zeros for any other input (token types)."""
    return {i.name: ids if i.name == "input_ids" else (np.ones_like(ids) if i.name == "attention_mask" else
            np.zeros_like(ids)) for i in session.get_inputs()}  # fmt: skip


def _views(model: Any, calibration: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Per calibration row, the views of the model's float outputs that a task reads: all values (per-token
    tasks), the mean over the sequence (mean pooling) and the first position (CLS pooling)."""
    session = _session(model)
    views: list[list[np.ndarray]] = []
    for ids in calibration:
        outputs = [np.asarray(o) for o in session.run(None, _feeds(session, ids))]
        rows = [o.astype(np.float64) for o in outputs if o.dtype.kind == "f" and o.ndim >= 1 and o.shape[0] == ids.shape[0]]
        for row in range(ids.shape[0]):
            picked = [o[row] for o in rows]
            views.append([v.ravel() for v in picked] + [v.mean(axis=0).ravel() for v in picked if v.ndim >= 2]
                         + [v[0].ravel() for v in picked if v.ndim >= 2])  # fmt: skip
    return views


def row_cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Cosine per row; two zero rows agree (1.0), a zero row against a non-zero one does not (0.0)."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    return [float(d / (x * y)) if x > 0 and y > 0 else float(x == y) for d, x, y in zip(dots, na, nb, strict=True)]


def _lowest_cosine(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> float:
    pairs = [(a, b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)]
    return min((row_cosines(a[None], b[None])[0] for a, b in pairs), default=1.0)


def calibration_ids(model: Any, tokenizer: Path | None) -> list[np.ndarray] | None:
    """Token id rows to calibrate on: the calibration texts through the model's tokenizer (one row each), else
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


def _vocab_size(model: Any) -> int | None:
    """Rows of the embedding table that ``input_ids`` indexes (the Gather reading it)."""
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            dims = tables.get(node.input[0])
            if dims:
                return int(dims[0])
    return None
