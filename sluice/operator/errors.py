"""What happens to a batch the engine fails on: bisect it until the failing records are isolated.

A model that raises on one bad input would otherwise take the whole batch -- and every good record in it --
to the dead-letter topic. Bisecting costs about ``2 * log2(batch size)`` extra engine calls per bad record and
keeps every good record flowing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine failed on this one item (alone), with this error."""

    error: BaseException


def infer_isolating(infer: Callable[[Sequence[Any]], list[Any]], items: Sequence[Any]) -> list[Any]:
    """Run ``infer`` on ``items``; where it raises, split the batch in halves and retry each half.

    Returns one entry per item, in order: the engine's result, or :class:`Failed` for an item that fails
    on its own. Exceptions that are not ``Exception`` (KeyboardInterrupt, SystemExit) propagate.
    """
    try:
        return infer(items)
    except Exception as err:
        if len(items) == 1:
            return [Failed(err)]
        log.info("engine failed on a batch of %d (%s: %s); bisecting", len(items), type(err).__name__, err)
    middle = len(items) // 2
    return infer_isolating(infer, items[:middle]) + infer_isolating(infer, items[middle:])
