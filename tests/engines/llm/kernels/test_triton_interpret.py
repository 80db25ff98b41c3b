"""Runs the Triton kernels' tests (interpret_cases.py) on the CPU under the Triton interpreter.

The interpreter is chosen by TRITON_INTERPRET=1 when the kernels are decorated, so it is set only in a
child pytest process: kernels imported elsewhere in this suite stay compiled (for CUDA).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.interpreter import TIMEOUT_S, run_interpreted


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_triton_kernels_match_reference_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    run_interpreted(Path(__file__).with_name("interpret_cases.py"))
