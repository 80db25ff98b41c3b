"""Bisection: a batch the engine fails on is split until the records that fail alone are found.

A model that raises on one bad input would otherwise take the whole batch -- and every good record in it --
to the dead-letter topic. Bisecting costs about ``2 * log2(batch size)`` extra engine calls per bad record.
An out-of-memory failure says nothing about the records: the batch is split and retried the same way, and
the :class:`~sluice.operator.failures.oom_governor.BatchSizeGovernor` lowers the batch size for the batches that
follow. Only a single record that fails (or alone runs out of memory) becomes :class:`Failed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.operator.failures.containment import error_text
from sluice.operator.failures.oom_governor import BatchSizeGovernor, is_out_of_memory

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine failed on this one item (alone), with this error."""

    error: BaseException


class WrongResultCount(Exception):
    """``infer`` returned a list that is not one result per input."""


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
