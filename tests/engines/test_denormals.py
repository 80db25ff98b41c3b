"""Denormal floats flushed to zero while an ONNX model runs (sluice/engines/onnx/denormals.py).

Each check runs in a fresh interpreter: a thread inherits its creator's floating-point mode, and onnxruntime
sets the mode of the thread that creates the process's first session."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"),
                                reason="the calling thread's mode is set on Linux x86-64 only")

_BLOCK = """
import json, numpy as np
from sluice.engines.onnx import denormals
tiny = np.float32(1e-39)  # a denormal: below float32's smallest normal number
seen = {"before": [denormals.thread_flushes(), float(tiny * np.float32(1.0))]}
with denormals.flushing() as flushed:
    seen["inside"] = [flushed, denormals.thread_flushes(), float(tiny * np.float32(1.0))]
seen["after"] = [denormals.thread_flushes(), float(tiny * np.float32(1.0))]
print(json.dumps(seen))
"""

_ENGINE = """
import json, sys, threading
import onnx
from onnx import TensorProto, helper
from sluice.engines.onnx import denormals
from sluice.engines.engine_contract import EngineContext
from sluice.engines.onnx.onnx_engine import ENGINE_TYPE, OnnxOptions
path, flush = sys.argv[1], sys.argv[2] == "on"
two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])], initializer=[two])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, path)
options = OnnxOptions(model=path, providers=["cpu"], task="raw", inputs={"x": "values"}, flush_denormals=flush)
engine = ENGINE_TYPE.factory(options, EngineContext(max_batch_size=4))
engine.start()
seen = {"creator_flushes": denormals.thread_flushes()}
def work():
    seen["y"] = engine.infer(engine.prepare([{"values": [1e-39, 3.0]}]))[0]["y"]
    seen["runner_flushes_after"] = denormals.thread_flushes()
worker = threading.Thread(target=work)
worker.start(); worker.join()
print(json.dumps(seen))
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_flushing_holds_inside_the_block_only() -> None:
    seen = _run(_BLOCK)
    assert seen["before"] == [False, pytest.approx(1e-39, rel=1e-3)]
    assert seen["inside"] == [True, True, 0.0]
    assert seen["after"] == seen["before"]


def test_the_engine_flushes_while_its_model_runs_unless_told_not_to(tmp_path: Path) -> None:
    on = _run(_ENGINE, str(tmp_path / "on.onnx"), "on")
    off = _run(_ENGINE, str(tmp_path / "off.onnx"), "off")
    assert on["y"] == [0.0, 6.0]  # the denormal input counted as zero
    assert off["y"] == [pytest.approx(2e-39, rel=1e-3), 6.0]
    for seen in (on, off):  # neither making the session nor running it leaves a thread flushing
        assert seen["creator_flushes"] is False and seen["runner_flushes_after"] is False
