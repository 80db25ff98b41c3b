"""The int8 rewrite of an ONNX graph's constant-weight MatMuls: int8 weights per output column, activations
quantised per row (per token) at run time, the products on the CPU's integer dot products (VNNI).

A ``MatMul(x, W)`` with ``W`` a constant float matrix ``(K, N)`` becomes::

    x2 = Reshape(x, [-1, K])                       # one row per token
    s  = max(max(ReduceMax(x2), -ReduceMin(x2)) / 127, 1e-12)    # per row
    xq = QuantizeLinear(x2, s, 128, axis=0)        # uint8, zero point 128: round(x / s) + 128 in [1, 255]
    y  = MatMulIntegerToFloat(xq, Wq, 1, ws, 128) * s[:, None]   # com.microsoft contrib op
    out = Reshape(y, shape(x)[:-1] + [N])

with ``Wq = round(W / ws)`` int8 and ``ws = max |W[:, n]| / 127`` per column, so each product is
``(s_i * q_i) . (ws_n * wq_n)``: the integer dot product scaled back. On an x86 CPU without VNNI the weights
take 7 bits (``ws = max |W[:, n]| / 63``, :func:`weight_qmax`): ONNX Runtime's uint8 x int8 kernel there sums
pairs of products in int16, which two 8-bit weights can overflow (it saturates: wrong results, silently).
Guarantees:

- *Per-row scales*: a row's result depends only on that row -- batch mates and padding never change a
  record's vector (per-tensor activation scales, ONNX Runtime's ``quantize_dynamic``, do: one long text's
  outliers cost every short text in the batch its resolution). A row's error is bounded by half a step of its
  own scale and of each weight column's.
- *Outlier split*: channels named for an input (``outliers``, found by :mod:`onnx_int8_plan`) are left out
  of the int8 product -- zeroed before the row scales are taken, their weight rows zeroed before the column
  scales are -- and computed in float32 beside it: ``Gemm(x2[:, c], W[c], y)`` adds their share in the same
  pass. One channel ten times the others no longer rounds a whole row to a few steps.
- *Fixed scales*: an input named in ``static`` (by :mod:`onnx_int8_plan`, where its calibrated rows agree
  in range) is quantised with one constant scale ``s`` for every row: ``QuantizeLinear(x2, s, 128)``, then
  ``MatMulIntegerToFloat(xq, Wq, s, ws, 128, bias)`` -- no reductions, no rescale, and a constant ``(N,)``
  bias ``Add`` that is the matmul's only reader folds into the GEMM. Still independent of batch mates; a
  value beyond 127 steps of ``s`` saturates.
- *Shared quantisation*: matmuls that read the same tensor (attention's Q, K and V projections) share one
  quantised copy of it (and its split channels).
- *Same interface*: inputs, outputs, names and shapes of the graph are unchanged; float weights no other node
  reads are dropped (a quarter of their bytes in the file).
- Cost: with per-row scales everywhere, the row scales, ``QuantizeLinear``, the rescale and the splits take
  a sizeable share of the int8 model's time, which fixed scales on the inputs that allow them cut
  (``bench/embed_engine.py`` compares the int8 model with the float32 one).
- Symmetric uint8 x int8 is the fast form of ONNX Runtime's integer GEMM on x86 (int8 x int8 ran slower than
  the float32 matmul); the min/max pair reads ``x`` twice but beats ``Abs`` + ``ReduceMax`` (which
  writes a copy), and ``QuantizeLinear`` does the divide, round, shift and saturate in one pass.

Pure: :func:`quantize_matmuls` edits the model proto in place, runs nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.engines.onnx.int8_weights import QMAX, quantize_weight, weight_qmax

__all__ = ["QMAX", "Candidate", "candidates", "name_nodes", "quantize_matmuls", "quantize_weight", "weight_qmax"]

CONTRIB = "com.microsoft"
EPS = 1e-12  # smallest activation scale: an all-zero row quantises to zeros, never divides by zero


@dataclass(frozen=True)
class Candidate:
    """A MatMul the rewrite can take: its node name and weight ``(K, N)`` elements."""

    name: str
    elements: int


def candidates(model: Any) -> list[Candidate]:
    """The MatMuls whose second input is a constant 2-D float32 matrix, in graph order."""
    from onnx import TensorProto

    weights = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        w = weights.get(node.input[1])
        if w is not None and len(w.dims) == 2 and w.data_type == TensorProto.FLOAT:
            found.append(Candidate(node.name, int(w.dims[0] * w.dims[1])))
    return found


def name_nodes(model: Any) -> None:
    """Give every unnamed or repeatedly named node (ONNX allows both) a name of its own, in place: matmuls are
    chosen by name, and their rewrites' tensors are named after them."""
    uses = Counter(n.name for n in model.graph.node)
    taken = set(uses)
    for index, node in enumerate(model.graph.node):
        if not node.name or uses[node.name] > 1:
            name = f"{node.name or 'sluice_int8/node'}{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def quantize_matmuls(model: Any, names: set[str], outliers: dict[str, list[int]] | None = None,
                     static: dict[str, float] | None = None) -> int:
    """Rewrite the candidate MatMuls named in ``names`` (in place); how many were rewritten.

    ``outliers``: per input tensor, the channels (last axis) to keep out of the int8 product: their share of
    each product is computed in float32 beside it, so the row's scale is set by the other channels.
    ``static``: per input tensor, a fixed activation scale (calibrated) in place of the per-row ones: no
    reductions, no rescale, and a constant bias ``Add`` after the matmul folds into the integer GEMM."""
    from onnx import helper

    chosen = {c.name for c in candidates(model)} & names
    if not chosen:
        return 0
    builder = _Builder(model, outliers or {}, static or {})
    biases = builder.fusable_biases(chosen)
    folded = {add.output[0] for add, _ in biases.values()}  # outputs are unique (SSA): they name the Adds
    nodes: list[Any] = []
    for node in model.graph.node:
        if node.name in chosen:
            nodes += builder.rewrite(node, biases.get(node.name))
        elif not (node.op_type == "Add" and node.output and node.output[0] in folded):
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = Counter(name for n in model.graph.node for name in n.input)
    kept = [t for t in model.graph.initializer if used[t.name] or t.name in builder.added]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    if not any(o.domain == CONTRIB for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB, 1))
    return len(chosen)


class _Builder:
    """Makes the nodes and constants of the rewrite; remembers each input's quantised rows and each weight's
    int8 form, so a tensor read by several matmuls is quantised once."""

    def __init__(self, model: Any, outliers: dict[str, list[int]], static: dict[str, float]) -> None:
        from onnx import numpy_helper

        self.model = model
        self.outliers = {x: sorted(c) for x, c in outliers.items() if c}
        self.static = {x: max(float(s), EPS) for x, s in static.items()}
        self.weights = {t.name: t for t in model.graph.initializer}
        self.to_array = numpy_helper.to_array
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.axes_as_input = opset >= 18  # ReduceMax / ReduceMin take their axes as an input from opset 18
        self.added: set[str] = set()
        # input tensor -> (quantised rows, row scales, lead shape, its outlier channels' rows or None)
        self.rows: dict[str, tuple[str, str, str, str | None]] = {}
        # (weight, channels split off its input) -> (int8 weight, column scales)
        self.quantised: dict[tuple[str, tuple[int, ...]], tuple[str, str]] = {}

    def fusable_biases(self, chosen: set[str]) -> dict[str, tuple[Any, str]]:
        """Per chosen matmul with a static input scale: the ``Add`` of a constant ``(N,)`` bias that is its
        output's only reader (and the bias), which the integer GEMM can take as its own bias input."""
        from onnx import TensorProto

        readers: dict[str, list[Any]] = {}
        for node in self.model.graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        outputs = {o.name for o in self.model.graph.output}
        found = {}
        for node in self.model.graph.node:
            if node.name not in chosen or node.input[0] not in self.static or node.output[0] in outputs:
                continue
            after = readers.get(node.output[0], [])
            if len(after) != 1 or after[0].op_type != "Add" or after[0].domain not in ("", "ai.onnx"):
                continue
            bias = self.weights.get(next((i for i in after[0].input if i != node.output[0]), ""))
            n = int(self.weights[node.input[1]].dims[1])
            if bias is not None and list(bias.dims) == [n] and bias.data_type == TensorProto.FLOAT and len(set(after[0].input)) == 2:
                found[node.name] = (after[0], bias.name)
        return found

    def rewrite(self, node: Any, bias: tuple[Any, str] | None = None) -> list[Any]:
        from onnx import helper

        x, w_name = node.input
        k, n = (int(d) for d in self.weights[w_name].dims)
        made: list[Any] = []
        if x not in self.rows:
            made += self._quantise_rows(x, k)
        xq, scales, lead, outliers = self.rows[x]
        channels = self.outliers.get(x, [])
        wq, ws = self._weight(w_name, channels)
        p = f"{node.name}/int8"
        a_zp = self._const("sluice_int8/zp", np.uint8(128))
        if x in self.static:  # one scale for every row: the GEMM scales back (and adds the bias) itself
            extra = ["", bias[1]] if bias else []
            made.append(helper.make_node("MatMulIntegerToFloat", [xq, wq, scales, ws, a_zp, *extra], [f"{p}/rows"],
                                         name=f"{p}/matmul", domain=CONTRIB))  # fmt: skip
        else:
            a_scale = self._const("sluice_int8/one", np.float32(1.0))
            made += [
                helper.make_node("MatMulIntegerToFloat", [xq, wq, a_scale, ws, a_zp], [f"{p}/y"],
                                 name=f"{p}/matmul", domain=CONTRIB),  # fmt: skip
                helper.make_node("Unsqueeze", [scales, self._const("sluice_int8/axis1", np.asarray([1], np.int64))],
                                 [f"{p}/s_col"], name=f"{p}/s_col"),  # fmt: skip
                helper.make_node("Mul", [f"{p}/y", f"{p}/s_col"], [f"{p}/rows"], name=f"{p}/rescale"),
            ]
        rows = f"{p}/rows"
        if outliers:  # the outlier channels' share in float32, added in the same pass: rows + x[:, c] @ W[c]
            w = self.to_array(self.weights[w_name]).astype(np.float32)[channels]
            w_rows = self._const(f"{w_name}/outlier_rows" + "".join(f"_{c}" for c in channels), w)
            made.append(helper.make_node("Gemm", [outliers, w_rows, rows], [f"{p}/rows_all"], name=f"{p}/outliers"))
            rows = f"{p}/rows_all"
        made += [
            helper.make_node("Concat", [lead, self._const(f"{p}/n", np.asarray([n], np.int64))], [f"{p}/shape"],
                             name=f"{p}/shape", axis=0),  # fmt: skip
            helper.make_node("Reshape", [rows, f"{p}/shape"], [bias[0].output[0] if bias else node.output[0]],
                             name=f"{p}/unrows"),  # fmt: skip
        ]
        return made

    def _quantise_rows(self, x: str, k: int) -> list[Any]:
        from onnx import TensorProto, helper

        p = f"{x}/int8_rows"
        reduce_inputs = [f"{p}/x2"]
        reduce_attrs: dict[str, Any] = {"keepdims": 0}
        if self.axes_as_input:
            reduce_inputs.append(self._const("sluice_int8/axis1", np.asarray([1], np.int64)))
        else:
            reduce_attrs["axes"] = [1]
        zp = helper.make_tensor(f"{p}/zp_value", TensorProto.UINT8, [1], [128])
        nodes = [
            helper.make_node("Reshape", [x, self._const(f"{p}/k", np.asarray([-1, k], np.int64))], [f"{p}/x2"],
                             name=f"{p}/rows"),  # fmt: skip
        ]
        channels = self.outliers.get(x, [])
        outliers = f"{p}/outliers" if channels else None
        if outliers:  # their rows, for the float32 Gemm beside the int8 product
            index = self._const(f"{p}/outlier_index", np.asarray(channels, np.int64))
            nodes.append(helper.make_node("Gather", [f"{p}/x2", index], [outliers], name=outliers, axis=1))
        if x in self.static:  # a fixed scale: the split channels' weight rows are zero, so they need no mask
            scale = self._const(f"{p}/scale", np.float32(self.static[x]))
            nodes += [
                helper.make_node("QuantizeLinear", [f"{p}/x2", scale, self._const("sluice_int8/zp", np.uint8(128))],
                                 [f"{p}/xq"], name=f"{p}/quantise"),  # fmt: skip
                *self._lead(x, p),
            ]
            self.rows[x] = (f"{p}/xq", scale, f"{p}/lead", outliers)
            return nodes
        if channels:  # quantise the other channels: the outliers no longer set the rows' scales
            mask = np.ones(k, np.float32)
            mask[channels] = 0.0
            nodes.append(helper.make_node("Mul", [f"{p}/x2", self._const(f"{p}/inlier_mask", mask)], [f"{p}/inliers"],
                                          name=f"{p}/inliers"))  # fmt: skip
            reduce_inputs[0] = f"{p}/inliers"
        nodes += [
            helper.make_node("ReduceMax", reduce_inputs, [f"{p}/max"], name=f"{p}/max", **reduce_attrs),
            helper.make_node("ReduceMin", reduce_inputs, [f"{p}/min"], name=f"{p}/min", **reduce_attrs),
            helper.make_node("Neg", [f"{p}/min"], [f"{p}/neg_min"], name=f"{p}/neg_min"),
            helper.make_node("Max", [f"{p}/max", f"{p}/neg_min"], [f"{p}/amax"], name=f"{p}/amax"),
            helper.make_node("Mul", [f"{p}/amax", self._const("sluice_int8/inv_qmax", np.float32(1.0 / QMAX))],
                             [f"{p}/s_raw"], name=f"{p}/s_raw"),  # fmt: skip
            helper.make_node("Max", [f"{p}/s_raw", self._const("sluice_int8/eps", np.float32(EPS))], [f"{p}/s"],
                             name=f"{p}/s"),  # fmt: skip
            helper.make_node("Shape", [f"{p}/s"], [f"{p}/s_shape"], name=f"{p}/s_shape"),
            helper.make_node("ConstantOfShape", [f"{p}/s_shape"], [f"{p}/zp"], name=f"{p}/zp", value=zp),
            helper.make_node("QuantizeLinear", [reduce_inputs[0], f"{p}/s", f"{p}/zp"], [f"{p}/xq"],
                             name=f"{p}/quantise", axis=0),  # fmt: skip
            *self._lead(x, p),
        ]
        self.rows[x] = (f"{p}/xq", f"{p}/s", f"{p}/lead", outliers)
        return nodes

    def _lead(self, x: str, p: str) -> list[Any]:
        """``x``'s shape but the last axis: what the rows are reshaped back to (with the output width)."""
        from onnx import helper

        return [
            helper.make_node("Shape", [x], [f"{p}/x_shape"], name=f"{p}/x_shape"),
            helper.make_node("Slice", [f"{p}/x_shape", self._const("sluice_int8/start", np.asarray([0], np.int64)),
                                       self._const("sluice_int8/end", np.asarray([-1], np.int64))], [f"{p}/lead"],
                             name=f"{p}/lead"),  # fmt: skip
        ]

    def _weight(self, name: str, channels: list[int]) -> tuple[str, str]:
        key = (name, tuple(channels))  # a weight two matmuls share (tied) may be read by inputs split differently
        if key not in self.quantised:
            w = self.to_array(self.weights[name]).astype(np.float32)
            w[channels] = 0.0  # their rows are computed in float32: they must not set the columns' scales
            wq, ws = quantize_weight(w)
            tag = "".join(f"_{c}" for c in channels)
            self.quantised[key] = (self._const(f"{name}/int8{tag}", wq), self._const(f"{name}/int8_scale{tag}", ws))
        return self.quantised[key]

    def _const(self, name: str, value: Any) -> str:
        from onnx import numpy_helper

        if name not in self.added:
            self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
            self.added.add(name)
        return name
