"""``delivery``'s settings (``exactly_once``) and ``runtime``: how outputs and offsets are committed."""

from __future__ import annotations

from pydantic import Field, model_validator

from sluice.config.section import Section


class Runtime(Section):
    drain_timeout_s: float = Field(default=30.0, gt=0)
    """On SIGTERM, the time to finish in-flight batches before exiting."""
    max_in_flight: int = Field(default=10_000, ge=1)
    """Records between poll and delivery; a partition over its share of it is paused (and still polled)."""
    commit_interval_ms: int = Field(default=1000, ge=10)
    """How often the completed-offset watermark is committed."""
    brake_after_ms: int | None = Field(default=None, ge=0)
    """At-least-once: once an output has waited this long for the brokers to acknowledge it, or stored
    offsets for the group to commit them, the run takes and processes no new records until they move. A
    rebalance during a broker or network fault then makes a process redo about this long's worth of
    records, not its whole in-flight window (default: three times `commit_interval_ms`; `0`: never brake)."""
    stall_timeout_s: float = Field(default=120.0, gt=0)
    """A part of the operator -- the poll loop, the engine, the delivery reports -- that owes work and gets
    none of it done for this long is stalled: `/healthz` answers 503 naming it (a liveness probe restarts
    the process), a warning is logged and `sluice_progress_stalled` is 1 for it. Set it above the longest batch (or
    LLM step) and the longest broker outage the process should ride out without a restart."""


class ExactlyOnce(Section):
    """Settings of ``delivery: exactly_once`` (a transactional producer, offsets inside the transaction)."""

    transactional_id: str | None = Field(default=None, min_length=1)
    """Unique per running process and stable across its restarts (default:
    `sluice-<group_id>-<hostname>-<slot>`, each process on a host holding the lowest free slot). Set it
    only where two hosts share a hostname."""
    transaction_interval_ms: int = Field(default=500, ge=10)
    """A transaction commits at least this often (an interval in which nothing happened commits nothing)."""
    transaction_max_batches: int = Field(default=64, ge=1)
    """...or after this many batches."""
    transaction_timeout_ms: int = Field(default=60_000, ge=1000)
    """The broker aborts a transaction open this long; must exceed the interval plus twice `max_batch_time_s`
    (checked by `sluice validate`)."""
    max_batch_time_s: float = Field(default=10.0, gt=0)
    """The longest one engine batch may take."""

    @model_validator(mode="after")
    def _fits_in_timeout(self) -> ExactlyOnce:
        # A transaction stays open for the interval, plus the batch running when the commit is due, plus
        # the commit itself (about one more batch time of margin).
        needed_ms = self.transaction_interval_ms + 2 * self.max_batch_time_s * 1000
        if self.transaction_timeout_ms <= needed_ms:
            raise ValueError(f"transaction_timeout_ms ({self.transaction_timeout_ms}) must exceed "
                             f"transaction_interval_ms + 2 x max_batch_time_s = {needed_ms:.0f} ms, or the broker "
                             "could abort a transaction while a batch is still running")
        return self
