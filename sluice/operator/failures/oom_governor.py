"""The out-of-memory governor: the largest batch the engine is given, lowered when it runs out of memory.

Running out of memory says nothing about the records in the batch; it says the batch was too large for
the device now. :class:`BatchSizeGovernor` halves the limit on such a failure and doubles it back after a
run of successes; bisection (sluice/operator/failures/bisection.py) reports each failure to it.
"""

from __future__ import annotations

import logging

from sluice.operator.failures.containment import error_text

log = logging.getLogger(__name__)


def is_out_of_memory(err: BaseException) -> bool:
    """True for the out-of-memory errors of Python, PyTorch (CUDA), ONNX Runtime and TensorRT."""
    if isinstance(err, MemoryError) or "OutOfMemory" in type(err).__name__:
        return True
    text = error_text(err)[1].lower()  # never raises, even for a message that cannot be read
    return "out of memory" in text or "failed to allocate memory" in text


class BatchSizeGovernor:
    """The largest batch the engine is given now: halved on out-of-memory, doubled back (up to the
    configured maximum) after ``recover_after`` batches in a row succeed. Used by the engine thread only."""

    def __init__(self, max_batch_size: int, recover_after: int = 32) -> None:
        self.max_batch_size = max_batch_size
        self.limit = max_batch_size
        self.recover_after = recover_after
        self._successes = 0

    def out_of_memory(self, batch_size: int) -> None:
        new_limit = max(1, min(self.limit, batch_size // 2))
        if new_limit < self.limit:
            log.warning("engine out of memory at batch size %d: batch size limited to %d", batch_size, new_limit)
        self.limit, self._successes = new_limit, 0

    def succeeded(self) -> None:
        if self.limit >= self.max_batch_size:
            return
        self._successes += 1
        if self._successes >= self.recover_after:
            self.limit, self._successes = min(self.max_batch_size, self.limit * 2), 0
            log.info("batch size limit raised back to %d", self.limit)
