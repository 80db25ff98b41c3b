"""The delivery strategy: how outputs and input offsets become durable together. One interface, chosen once
when the runner is built; the runner calls it at fixed points and never asks which one it has.

=====================  ============================================================================
the runner calls       when
=====================  ============================================================================
``start(now)``         once, before subscribing
``tick(now)``          every pass of the poll loop, after delivery reports were served
``revoke(tps)``        partitions are about to move: their queued records are already dropped; what
                       is in flight for them is still in the ledger and may be committed now
``lost(tps)``          partitions were taken away (session timeout): already dropped and forgotten;
                       nothing of theirs may be committed
``shutdown(deadline)`` once, after the engine thread has drained (or timed out): the last commit
=====================  ============================================================================

``tick``, ``revoke`` and ``lost`` return :data:`Outcome.REWOUND` when the strategy dropped every record in
flight and rewound the consumer to the committed offsets (an aborted transaction); the runner then starts
the intake over (stalled partitions, idle clock). A strategy never raises out of these calls: a failure after
which the operator must stop becomes the state's stop reason (:meth:`SharedState.stop`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from sluice.config import Pipeline
from sluice.operator.ports import Sink, Source
from sluice.operator.record import TopicPartition
from sluice.operator.state import SharedState


class Outcome(enum.Enum):
    KEPT = "kept"  # what is in flight stays in flight
    REWOUND = "rewound"  # everything in flight was dropped and the consumer rewound


class Delivery(ABC):
    """A delivery guarantee. Every method runs on the intake thread."""

    in_order: ClassVar[bool]  # outputs must leave in input order per partition (the ledger holds them back)

    def __init__(self, pipeline: Pipeline, state: SharedState, source: Source, sink: Sink,
                 clock: Callable[[], float]) -> None:
        self.pipeline, self.state, self.source, self.sink, self.clock = pipeline, state, source, sink, clock

    def start(self, now_s: float) -> None:  # noqa: B027 - optional hook
        """Before the first poll."""

    @abstractmethod
    def tick(self, now_s: float) -> Outcome:
        """Store or commit what is due."""

    @abstractmethod
    def revoke(self, tps: list[TopicPartition]) -> Outcome:
        """Settle what is in flight for ``tps`` before they move."""

    def lost(self, tps: list[TopicPartition]) -> Outcome:
        """``tps`` were taken away; by default nothing else changes."""
        return Outcome.KEPT

    @abstractmethod
    def shutdown(self, deadline_s: float, forced: bool = False) -> None:
        """The final commit, by ``deadline_s`` where that is in the strategy's hands. ``forced`` (a second
        signal): commit nothing that is not delivered and wait for nothing more -- an open transaction is
        aborted."""
