"""The operator's two ports: what it needs of a source (a consumer) and of a sink (a producer).

The Kafka connectors (sluice/connectors/kafka/) and the file connectors (sluice/connectors/files/) implement
both; tests implement them in memory
(tests/operator/memory.py). Each method says which thread calls it. The transactional methods are part of
the contract because the exactly-once delivery strategy calls them; under at-least-once they are never
called, and a source or sink that cannot do transactions may raise from them.

Errors after which the operator must stop are raised as :class:`SourceFailed` / :class:`ProduceFailed`;
each message is one line a user can act on, and becomes the run's stop reason
(``sluice: stopped on error: ...``), never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sluice.operator.record import Headers, InputRecord, TopicPartition

PartitionsCallback = Callable[[list[TopicPartition]], None]


class ProduceFailed(Exception):
    """The sink refused a record for good (a fatal client error, a fenced producer...)."""


class SourceFailed(Exception):
    """The consumer hit a fatal error (fenced by a static member with the same ``group.instance.id``...)."""


class Source(Protocol):
    """The input. Every method is called from the intake thread; the callbacks given to :meth:`subscribe`
    are called from within :meth:`poll` (and :meth:`close`), on that thread."""

    assignment: set[TopicPartition]  # the partitions assigned now
    # True: the source ends by itself (files; topics read up to their end offsets with --until-end), and
    # ``lag`` says how many records are left to hand out.
    bounded: bool

    def subscribe(self, on_assign: PartitionsCallback, on_revoke: PartitionsCallback,
                  on_lost: PartitionsCallback) -> None:
        """Join the group. ``on_revoke`` runs before revoked partitions move (their offsets can still be
        committed); ``on_lost`` after they were taken away (nothing of theirs can be committed)."""

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        """Up to ``max_records`` records of assigned partitions, in offset order per partition; waits up to
        ``timeout_s`` only when none is ready. Raises SourceFailed."""

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        """Offsets to commit with the next periodic commit (at-least-once)."""

    def commit(self, watermarks: dict[TopicPartition, int]) -> None:
        """Commit offsets now (at-least-once: revoke, shutdown)."""

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching ``tps`` (they stay assigned; polling goes on)."""

    def resume(self, tps: Iterable[TopicPartition]) -> None: ...

    @property
    def paused_partitions(self) -> set[TopicPartition]: ...

    def lag(self) -> dict[TopicPartition, int]:
        """Records behind the end, per assigned partition, as last known (for telemetry)."""

    def uncommitted_since(self) -> float | None:
        """At-least-once: since when stored offsets have waited for the group to commit them (None: none
        waits, or this source commits at once)."""

    def group_metadata(self) -> Any:
        """Exactly-once: the consumer's group metadata, sent with the offsets of each transaction."""

    def rewind(self, tps: Iterable[TopicPartition]) -> None:
        """Exactly-once: seek ``tps`` back to their committed offsets (after an aborted transaction)."""

    def is_exhausted(self) -> bool:
        """A bounded source has handed out every record up to its end: the run finishes what is in flight,
        commits and stops (exit 0). An unbounded source never is."""

    def close(self) -> None:
        """Leave the group; called once, last."""


class Sink(Protocol):
    """The output. ``produce`` is called from either thread; everything else from the intake thread, which
    is the only one to serve delivery reports (so a report callback never runs beside another)."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers,
                on_delivery: Callable[[Any, Any], None]) -> None:
        """Queue one record; ``on_delivery(error or None, message)`` is called once, when the broker
        answered. May block for room (backpressure). Raises ProduceFailed."""

    def poll(self, timeout_s: float = 0) -> int:
        """Serve delivery reports; returns how many were served."""

    def flush(self, timeout_s: float) -> int:
        """Wait for every queued record's report; returns how many are still outstanding."""

    def num_pending(self) -> int:
        """Records produced whose report has not been served yet (any thread: the health check reads it)."""

    def max_message_bytes(self, topic: str) -> int:
        """The largest record ``topic`` accepts (value, key and headers)."""

    def init_transactions(self, timeout_s: float = 60) -> None:
        """Exactly-once: register the transactional id (fencing an older producer with it)."""

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any,
                           timeout_s: float) -> None:
        """Exactly-once: the consumer offsets and every record produced since ``begin`` commit together."""

    def abort_transaction(self, timeout_s: float) -> None: ...

    def recreate(self) -> None:
        """Exactly-once: replace the producer by a new one (after an ambiguous commit or abort)."""
