"""A user function that takes its time, for run_pipeline's tests (python engine: ``tests.testing.slow_functions``)."""

from __future__ import annotations

import time


def upper_slowly(texts: list[str]) -> list[str]:
    time.sleep(0.1)
    return [t.upper() for t in texts]
