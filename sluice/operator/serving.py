"""The model serving now: an engine and the identity its outputs carry (the ``sluice.model`` header).

One :class:`Serving` is made per started engine and never changes; a reload makes a second one. Each
thread holds the one it works with -- the intake the engine whose ``prepare`` it calls, the engine thread
the one whose ``infer`` / ``step`` it calls -- and a switch hands the new one from the intake to the engine
thread through the shared state's :class:`~sluice.operator.reload.switch.ModelSwitch` (``offer``, then its two
hooks: ``at_intake`` and ``between_batches``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.engines.engine_contract import BatchEngine, ContinuousEngine
from sluice.engines.identity import ModelIdentity

Engine = BatchEngine | ContinuousEngine


@dataclass(frozen=True, slots=True)
class Serving:
    """A started engine and its model's identity."""

    engine: Engine
    identity: ModelIdentity
    warmup_s: float = 0.0  # how long its start (load and warm-up) took
    header: bytes = field(init=False)  # the sluice.model header's value, encoded once

    def __post_init__(self) -> None:
        object.__setattr__(self, "header", self.identity.header)
