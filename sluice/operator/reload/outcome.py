"""What one reload attempt came to: plain data for the log, the metrics and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.engines.identity import ModelIdentity

Result = Literal["ready", "unchanged", "failed"]
# why a reload failed: no room for a second engine, the model could not be read, the new engine failed to
# start or warm up, its results have another schema, or the model changed again while it loaded
Stage = Literal["memory", "read", "start", "schema", "changed"]


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """One attempt: ``ready`` (built and warmed up, about to serve), ``unchanged`` (the model on disk is
    the serving one) or ``failed`` (the serving engine stays; ``stage`` and ``reason`` say why)."""

    result: Result
    identity: ModelIdentity | None  # the model found on disk, when it could be read
    seconds: float  # from the attempt's start to its end (hashing, building, warming up)
    stage: Stage | None = None
    reason: str | None = None  # one line
