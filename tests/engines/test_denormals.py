"""Denormal floats flushed to zero on the thread that runs an ONNX model (sluice/engines/backends/denormals.py).

Each check runs in a fresh interpreter: a thread inherits its creator's floating-point mode, and other tests
run engines on pytest's own thread."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"),
                                reason="the calling thread's mode is set on Linux x86-64 only")

_ONE_THREAD = """
import json, threading, numpy as np
from sluice.engines.backends import denormals
tiny = np.float32(1e-39)  # a denormal: below float32's smallest normal number
seen = {}
def work():
    seen["before"] = [denormals.thread_flushes(), float(tiny * np.float32(1.0))]
    seen["set"] = denormals.flush_on_this_thread()
    seen["after"] = [denormals.thread_flushes(), float(tiny * np.float32(1.0))]
    seen["again"] = denormals.flush_on_this_thread()
worker = threading.Thread(target=work)
worker.start(); worker.join()
seen["main"] = [denormals.thread_flushes(), float(tiny * np.float32(1.0))]
print(json.dumps(seen))
"""

_ENGINE = """
import json, sys, threading
from sluice.engines.backends import denormals
from sluice.engines.base import EngineContext
from sluice.engines.onnx import ENGINE_TYPE, OnnxOptions
flush = sys.argv[1] == "on"
options = OnnxOptions(model="minilm-l6", providers=["cpu"], intra_op_num_threads=2, flush_denormals=flush)
engine = ENGINE_TYPE.factory(options, EngineContext(max_batch_size=4))
engine.start()
seen = {"config": engine.backend._session_options(__import__("onnxruntime")).get_session_config_entry(
    denormals.SESSION_CONFIG_KEY) if flush else None}
def work():
    items = [engine.prepare([text])[0] for text in ["ok", "a much longer review " * 30]]  # a padded batch
    seen["vectors"] = engine.infer(items)
    seen["flushes"] = denormals.thread_flushes()
worker = threading.Thread(target=work)
worker.start(); worker.join()
print(json.dumps(seen))
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_flushing_changes_the_calling_thread_only() -> None:
    seen = _run(_ONE_THREAD)
    assert seen["before"] == [False, pytest.approx(1e-39, rel=1e-3)]
    assert seen["set"] is True and seen["again"] is True
    assert seen["after"] == [True, 0.0]
    assert seen["main"] == [False, pytest.approx(1e-39, rel=1e-3)]


def test_the_engine_flushes_on_its_inference_thread_unless_told_not_to(minilm_dir: Path) -> None:
    on, off = _run(_ENGINE, "on"), _run(_ENGINE, "off")
    assert on["flushes"] is True and on["config"] == "1"
    assert off["flushes"] is False
    for a, b in zip(on["vectors"], off["vectors"], strict=True):  # flushing values below 1e-38 changes nothing
        assert a == pytest.approx(b, abs=1e-6)
