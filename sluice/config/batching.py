"""``batching``: how records are gathered into the batches a batch engine runs (sluice/operator/batcher.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.config.base import Section


class Batching(Section):
    max_batch_size: int = Field(default=32, ge=1, le=100_000)
    max_queue_delay_ms: float = Field(default=10.0, ge=0, le=600_000)
    bucket_by: Literal["none", "tokens"] = "none"  # tokens: group records of similar length
    max_batch_tokens: int | None = Field(default=None, ge=1)  # cap on batch size x padded length
    # Width of a length bucket when bucket_by is tokens: records whose lengths round up to the same
    # multiple of this share a batch.
    bucket_width: int = Field(default=16, ge=1)
    # Adaptive mode: the latency (queue wait + service) records should stay under. Sluice then learns the
    # engine's service time and the arrival rate and chooses each batch's size (up to max_batch_size);
    # max_queue_delay_ms is not used.
    latency_target_ms: float | None = Field(default=None, gt=0)

    @property
    def max_delay_s(self) -> float:
        """How long the batcher may hold a record. In adaptive mode the target stands in for the delay: the
        policy then decides when a batch goes, and a record is never held past the target by the batcher."""
        delay_ms = self.latency_target_ms if self.latency_target_ms is not None else self.max_queue_delay_ms
        return delay_ms / 1000
