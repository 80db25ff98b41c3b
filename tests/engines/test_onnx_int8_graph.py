"""The int8 MatMul rewrite on tiny random graphs, against a numpy reference of what it promises.

Reference: per row ``s = max|x| / 127``, ``q = rint(x / s)``; per weight column ``ws = max|W| / 127``,
``wq = rint(W / ws)``; the product ``(q @ wq) * s * ws``. Also: a row's result never depends on its batch
mates, matmuls reading one tensor share one quantisation, the graph keeps its interface, and both the
opset-17 (axes as attribute) and opset-18 (axes as input) forms of the reductions run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sluice.engines.onnx.int8_graph import candidates, name_nodes, quantize_matmuls, quantize_weight

K = 16


def _model(opset: int, seed: int = 0) -> Any:
    """x (batch, seq, K) -> two matmuls reading x (5 and 3 columns) and a third reading the first's output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {"w1": rng.normal(size=(K, 5)), "w2": rng.normal(size=(K, 3)) * 0.01, "w3": rng.normal(size=(5, 4))}
    inits = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y1"], name="mm1"),
             helper.make_node("MatMul", ["x", "w2"], ["y2"], name="mm2"),
             helper.make_node("MatMul", ["y1", "w3"], ["y3"], name="mm3")]  # fmt: skip
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", w]) for n, w in (("y2", 3), ("y3", 4))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
                              outputs, inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), weights


def _run(model: Any, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})


def _reference(x: np.ndarray, w: np.ndarray, outliers: tuple[int, ...] = ()) -> np.ndarray:
    """The int8 product; the ``outliers`` channels left out of it (zeroed) and added in float64."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    inliers, w_in = rows.copy(), w.astype(np.float32).copy()
    inliers[:, list(outliers)], w_in[list(outliers)] = 0.0, 0.0
    s = np.maximum(np.abs(inliers).max(axis=1) / 127.0, 1e-12)
    q = np.clip(np.rint(inliers / s[:, None]), -127, 127)
    wq, ws = quantize_weight(w_in)
    out = (q @ wq.astype(np.float64)) * s[:, None] * ws.astype(np.float64)
    out += rows[:, list(outliers)] @ w[list(outliers)].astype(np.float64)
    return out.reshape(*x.shape[:-1], w.shape[1])


@pytest.mark.parametrize("opset", [17, 18])
def test_the_rewrite_computes_the_per_token_int8_product(opset: int) -> None:
    import onnx

    model, weights = _model(opset)
    assert [c.name for c in candidates(model)] == ["mm1", "mm2", "mm3"]
    assert quantize_matmuls(model, {"mm1", "mm2"}) == 2
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("MatMul") == 1  # mm3 left float32
    assert ops.count("QuantizeLinear") == 1  # x, read by both, quantised once
    assert {t.name for t in model.graph.initializer} >= {"w3"} and "w1" not in {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 7, K)) * np.exp(rng.normal(size=(3, 7, 1)))  # rows of very different magnitudes
    x[1, 2] = 0.0  # an all-zero row quantises to zeros
    y2, y3 = _run(model, x)
    want2 = _reference(x, weights["w2"])
    assert y2.shape == (3, 7, 3)
    assert np.abs(y2 - want2).max() <= 1e-5 * np.abs(want2).max()
    want3 = _reference(x, weights["w1"]) @ weights["w3"]  # mm3 float32 on mm1's int8 output
    assert np.abs(y3 - want3).max() <= 1e-5 * np.abs(want3).max()
    assert np.all(y2[1, 2] == 0.0)
    exact = x @ weights["w2"]  # and int8 is close to the float32 product, row by row
    cos = (y2 * exact).sum(-1) / (np.linalg.norm(y2, axis=-1) * np.linalg.norm(exact, axis=-1) + 1e-30)
    assert cos[np.abs(exact).sum(-1) > 0].min() > 0.999


def test_outlier_channels_split_off_are_computed_in_float32_beside_the_int8_product() -> None:
    import onnx

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, K))
    x[..., 3] *= 200.0  # channel 3 is an outlier in every row, as LayerNorm outputs' are
    x[..., 11] *= 50.0
    plain, _ = _model(17)
    quantize_matmuls(plain, {"mm1", "mm2"})
    split, weights = _model(17)
    assert quantize_matmuls(split, {"mm1", "mm2"}, {"x": [11, 3]}) == 2
    onnx.checker.check_model(split)
    ops = [n.op_type for n in split.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("Gather") == 1 and ops.count("Gemm") == 2
    got, unsplit = _run(split, x)[0], _run(plain, x)[0]
    want = _reference(x, weights["w2"], (3, 11))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    exact = x @ weights["w2"]
    assert np.abs(got - exact).max() < 0.05 * np.abs(unsplit - exact).max()  # the split is what mends it


def test_a_rows_result_does_not_depend_on_its_batch_mates() -> None:
    model, _ = _model(17)
    quantize_matmuls(model, {c.name for c in candidates(model)})
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, K))
    alone = _run(model, x[:1])
    loud = x.copy()
    loud[1] *= 1000.0  # a batch mate with outliers a thousand times larger
    loud[1, 0, 3] = 1e6
    mixed = _run(model, loud)
    for a, m in zip(alone, mixed, strict=True):
        np.testing.assert_array_equal(a[0], m[0])


def test_only_constant_float_matrices_are_candidates() -> None:
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ones((K, 2), np.float32), "w"),
             numpy_helper.from_array(np.ones((K, 2), np.float16), "w16"),
             numpy_helper.from_array(np.ones((2, K, 2), np.float32), "w3d")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="const"),
             helper.make_node("MatMul", ["x", "x_t"], ["b"], name="activations"),
             helper.make_node("MatMul", ["x16", "w16"], ["c"], name="half"),
             helper.make_node("MatMul", ["x", "w3d"], ["d"], name="batched")]  # fmt: skip
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [info("x", TensorProto.FLOAT, [2, K]), info("x_t", TensorProto.FLOAT, [K, 2]),
                                           info("x16", TensorProto.FLOAT16, [2, K])],
                              [info(n, TensorProto.FLOAT, None) for n in "abd"], inits)  # fmt: skip
    model = helper.make_model(graph)
    assert [(c.name, c.elements) for c in candidates(model)] == [("const", 2 * K)]
    assert quantize_matmuls(model, {"activations", "half", "batched"}) == 0  # not candidates: left alone


def test_unnamed_and_repeatedly_named_matmuls_are_renamed_and_rewritten_each_as_itself() -> None:
    model, weights = _model(17)
    for node, name in zip(model.graph.node, ["mm", "", "mm"], strict=True):
        node.name = name  # ONNX allows unnamed and repeated names; a set of names would collapse them
    name_nodes(model)
    names = [c.name for c in candidates(model)]
    assert len(set(names)) == 3 and all(names)
    assert quantize_matmuls(model, set(names[:2])) == 2
    x = np.random.default_rng(4).normal(size=(1, 3, K))
    y2 = _run(model, x)[0]
    np.testing.assert_allclose(y2, _reference(x, weights["w2"]), rtol=1e-5, atol=1e-7)


def test_a_fixed_scale_quantises_every_row_alike_saturates_beyond_it_and_takes_the_bias_into_the_gemm() -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w, bias, scale = rng.normal(size=(K, 6)).astype(np.float32), rng.normal(size=6).astype(np.float32), 0.02
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 6])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert quantize_matmuls(model, {"mm"}, {"x": [2]}, {"x": scale}) == 1
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert "Add" not in ops and "ReduceMax" not in ops and "Mul" not in ops  # bias in the GEMM, no row scales
    x = rng.normal(size=(2, 5, K))
    x[..., 2] *= 100.0  # the split channel: computed in float32 whatever the scale
    x[1, 3, 7] = 40.0  # far beyond 127 steps of the scale: saturates
    rows = x.reshape(-1, K).astype(np.float64)
    w_in = w.copy()
    w_in[2] = 0.0
    wq, ws = quantize_weight(w_in)
    q = np.clip(np.rint(rows / np.float32(scale)), -128, 127)
    q[:, 2] = 0.0
    want = (q @ wq.astype(np.float64)) * np.float32(scale) * ws + bias + rows[:, [2]] @ w[[2]].astype(np.float64)
    got = _run(model, x)[0]
    assert got.shape == (2, 5, 6)
    np.testing.assert_allclose(got.reshape(-1, 6), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert abs(got[1, 3] - (x[1, 3] @ w + bias)).max() > 1.0  # the saturated row is off, as the reference says


def test_a_bias_add_that_is_not_the_matmuls_only_reader_stays_as_it_is() -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    w, bias = rng.normal(size=(K, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"), helper.make_node("Add", ["xw", "b"], ["y"]),
             helper.make_node("Neg", ["xw"], ["z"])]  # fmt: skip
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", 3]) for n in ("y", "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
                              outs, inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    quantize_matmuls(model, {"mm"}, None, {"x": 0.05})
    assert [n.op_type for n in model.graph.node].count("Add") == 1
    x = rng.normal(size=(1, 4, K))
    y, z = _run(model, x)
    np.testing.assert_allclose(y, -z + bias, rtol=1e-5, atol=1e-5)
