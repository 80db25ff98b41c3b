"""A reload's switch from the serving engine to a new one: a state machine shared by the intake and engine
threads, reached through two hooks -- :meth:`ModelSwitch.at_intake` (the intake, every pass and when it
queues) and :meth:`ModelSwitch.between_batches` (the engine thread, before it takes work). The record path
asks each hook one attribute read when no reload is under way; everything else about switching is here.

Records prepared by the old engine run on it, the rest on the new one (:class:`Stage`). Every transition
happens under the shared state's ``cond``.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from sluice.operator.batcher import Batcher
from sluice.operator.record import Pending
from sluice.operator.serving import Serving


class Stage(enum.Enum):
    """Where a switch is.

    * ``OFFERED`` (intake): a new engine is ready; the intake still prepares with the old one;
    * ``SEALED`` (engine thread, at a batch boundary): what is queued is the old engine's -- a batch engine's
      next batch takes what fits, the rest is sealed in the batcher (it runs on the old engine first);
    * ``ACKED`` (intake): records are prepared by the new engine from now on; those the old one prepared
      after the seal are prepared again by the new one (one poll's worth at most), never queued;
    * back to ``NONE`` (engine thread): once acknowledged and the sealed records are taken, it switches.

    Sealing when the engine is free, not when the new engine is offered, and preparing the late ones again,
    is what keeps the switch cheap: what arrived while the old engine worked joins its next batch, as it
    would without a reload, and nothing waits behind a batch of its own."""

    NONE = "none"
    OFFERED = "offered"
    SEALED = "sealed"
    ACKED = "acked"


class ModelSwitch:
    """One switch at a time between the engine serving and a reloaded one (``cond``: the shared state's)."""

    def __init__(self, cond: threading.Condition, batcher: Batcher[Pending]) -> None:
        self.cond = cond
        self.batcher = batcher
        self.stage = Stage.NONE
        self.next_model: Serving | None = None

    # ---------------------------------------------------------------------------------- intake thread

    def offer(self, serving: Serving) -> None:
        """A reloaded model is ready (NONE -> OFFERED)."""
        with self.cond:
            assert self.stage is Stage.NONE, "one switch at a time"
            self.next_model, self.stage = serving, Stage.OFFERED
            self.cond.notify_all()

    def at_intake(self) -> Serving | None:
        """The intake's hook, every pass and before it queues (``cond`` held or not): the model to prepare
        with from now on, once the engine thread sealed what the old one prepared (SEALED -> ACKED)."""
        if self.stage is not Stage.SEALED:  # one attribute read on the hot path
            return None
        with self.cond:
            if self.stage is not Stage.SEALED:
                return None
            self.stage = Stage.ACKED
            self.cond.notify_all()  # the engine thread may switch now
            return self.next_model

    # ---------------------------------------------------------------------------------- engine thread

    def between_batches(self, last_batch: Callable[[], list[Pending]] | None = None,
                        once_sealed_taken: bool = True) -> tuple[list[Pending], Serving | None]:  # fmt: skip
        """The engine thread's hook, free between two batches, ``cond`` held: (the old engine's last batch,
        the model to switch to now). Offered a model, it takes ``last_batch()`` -- what the old engine
        prepared and fits -- and seals the rest for the old engine (OFFERED -> SEALED); once the intake
        follows (and, with ``once_sealed_taken``, the sealed records are taken) it hands over the new model
        (ACKED -> NONE)."""
        if self.stage is Stage.NONE:  # one attribute read on the hot path
            return [], None
        if self.stage is Stage.OFFERED:
            batch = last_batch() if last_batch is not None else []
            self.batcher.seal()
            self.stage = Stage.SEALED
            return batch, None
        if self.stage is not Stage.ACKED or (once_sealed_taken and self.batcher.num_sealed):
            return [], None
        serving, self.next_model, self.stage = self.next_model, None, Stage.NONE
        return [], serving

    def take_unused(self) -> Serving | None:
        """Exiting: a model offered and never switched to (the run stopped first), to be closed."""
        with self.cond:
            serving, self.next_model, self.stage = self.next_model, None, Stage.NONE
            return serving
