"""What happens to a batch the engine fails on.

* A record the model cannot handle: bisect the batch until the failing records are isolated. A model that
  raises on one bad input would otherwise take the whole batch -- and every good record in it -- to the
  dead-letter topic. Bisecting costs about ``2 * log2(batch size)`` extra engine calls per bad record.
* The engine ran out of memory: that says nothing about the records, so the batch is split and retried,
  and :class:`BatchSizeGovernor` lowers the batch size for the batches that follow; it grows back after a
  run of successes. Only a single record that alone runs out of memory is dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.operator.containment import error_text

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine failed on this one item (alone), with this error."""

    error: BaseException


class WrongResultCount(Exception):
    """``infer`` returned a list that is not one result per input."""


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


def infer_isolating(infer: Callable[[Sequence[Any]], list[Any]], items: Sequence[Any],
                    governor: BatchSizeGovernor | None = None) -> list[Any]:
    """Run ``infer`` on ``items``; where it raises, split the batch in halves and retry each half.

    Returns one entry per item, in order: the engine's result, or :class:`Failed` for an item that fails
    on its own. A call that returns the wrong number of results counts as failed. Exceptions that are not
    ``Exception`` (KeyboardInterrupt, SystemExit) propagate.
    """
    try:
        results = infer(items)
        if len(results) != len(items):
            raise WrongResultCount(f"the engine returned {len(results)} results for {len(items)} inputs")
    except Exception as err:
        if governor is not None and is_out_of_memory(err):
            governor.out_of_memory(len(items))
        if len(items) == 1:
            return [Failed(err)]
        log.info("engine failed on a batch of %d (%s: %.200s); splitting it", len(items), *error_text(err))
    else:
        if governor is not None:
            governor.succeeded()
        return results
    middle = len(items) // 2
    return infer_isolating(infer, items[:middle], governor) + infer_isolating(infer, items[middle:], governor)
