"""``batching``: how records are gathered into the batches a batch engine runs (sluice/operator/batcher.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.config.section import Section


class Batching(Section):
    max_batch_size: int = Field(default=32, ge=1, le=100_000)
    """A batch never holds more records."""
    max_queue_delay_ms: float = Field(default=10.0, ge=0, le=600_000)
    """How long a record may wait for its batch to fill while the engine is idle."""
    bucket_by: Literal["none", "tokens"] = "none"
    """`tokens`: batch records of similar length together (the engine tells the length), so short texts are
    not padded to long ones."""
    max_batch_tokens: int | None = Field(default=None, ge=1)
    """A cap on a batch's records times its longest length."""
    bucket_width: int = Field(default=16, ge=1)
    """With `bucket_by: tokens`, lengths that round up to the same multiple of this share a bucket."""
    latency_target_ms: float | None = Field(default=None, gt=0)
    """Adaptive batching: Sluice learns the engine's time and the arrival rate and chooses each batch's size
    and wait to keep queue wait plus engine time under this (`max_batch_size` stays the upper bound)."""

    @property
    def max_delay_s(self) -> float:
        """How long the batcher may hold a record. In adaptive mode the target stands in for the delay: the
        policy then decides when a batch goes, and a record is never held past the target by the batcher."""
        delay_ms = self.latency_target_ms if self.latency_target_ms is not None else self.max_queue_delay_ms
        return delay_ms / 1000
