"""Runs structured_interpret_cases.py on the CPU under the Triton interpreter, in a child pytest.

The interpreter is chosen by TRITON_INTERPRET=1 when kernels are decorated, so it is set only in a child
process: kernels imported elsewhere in this suite stay compiled (for CUDA).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_bitmask_kernel_and_constrained_decoding_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SLUICE_KERNELS": "triton"}
    cases = Path(__file__).with_name("structured_interpret_cases.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(cases)],
        env=env, capture_output=True, text=True, timeout=500,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
