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


def run_interpreted(cases: Path, env: Mapping[str, str] | None = None, timeout_s: float = 500) -> None:
    """Run ``cases`` with ``TRITON_INTERPRET=1`` (plus ``env``); AssertionError with the report unless every
    test in it passed and none was skipped."""
    child_env = {k: v for k, v in os.environ.items() if k != "SLUICE_KERNELS"}
    child_env.update({"TRITON_INTERPRET": "1", **(env or {})})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(cases)],
        env=child_env, capture_output=True, text=True, timeout=timeout_s,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
