"""Runs structured_interpret_cases.py (the bitmask kernel, and constrained decoding through the Triton
kernels) on the CPU under the Triton interpreter, in a child pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.interpreter import TIMEOUT_S, run_interpreted


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_bitmask_kernel_and_constrained_decoding_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    run_interpreted(Path(__file__).with_name("structured_interpret_cases.py"))
