"""Run a file of Triton kernel tests in a child pytest under the Triton CPU interpreter.

The interpreter is chosen by TRITON_INTERPRET=1 when kernels are decorated, so it is set only in a child
process: kernels imported elsewhere in the suite stay compiled (for CUDA).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# The cases take about a minute on a quiet two-core machine; the bound is for a hung child, not a slow one
# (a loaded CI machine runs them several times slower): the tests calling this raise their own timeout to it.
TIMEOUT_S = 1500


def run_interpreted(cases: Path, env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S) -> None:
    """Run ``cases`` with ``TRITON_INTERPRET=1`` (plus ``env``); AssertionError with the report unless every
    test in it passed and none was skipped."""
    child_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(cases)],
        env=child_env, capture_output=True, text=True, timeout=timeout_s,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
