"""In-order release of outputs, per input partition: what exactly-once needs from a reordering pipeline.

A transaction commits its outputs together with each partition's offset *watermark*, the offset after the
longest run of finished records. Records can finish out of order (a record that fails to decode is
dead-lettered at once, ``bucket_by: tokens`` lets short records overtake long ones, the LLM engine finishes
short generations first). If such a record's output went into a transaction while an earlier record of its
partition was unfinished, the watermark would stop before it: a crash or a rebalance then re-processes it
and its output is committed twice. Holding each output back until every earlier record of its partition
has been released keeps the invariant the transaction needs: **every output in the producer belongs to a
record below the partition's first unreleased offset**, so once the producer is flushed the committed
watermark covers exactly the records whose outputs are in the transaction.

Pure bookkeeping, no I/O and no locking (the caller holds the runner's lock):

1. ``track(tp, offset)`` when a record is polled, in offset order per partition;
2. ``offer(tp, offset, item)`` when its output is ready; returns the items now releasable, in order;
3. ``forget(tp)`` / ``forget_all()`` when partitions are revoked, lost or rewound: their held items are
   dropped (their records are processed again by whoever owns the partition next).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sluice.operator.record import TopicPartition

T = TypeVar("T")


@dataclass(slots=True)
class _Partition(Generic[T]):
    unreleased: deque[int] = field(default_factory=deque)  # tracked offsets not released yet, ascending
    held: dict[int, T] = field(default_factory=dict)  # offset -> item, ready but behind an unreleased offset


class ReleaseGate(Generic[T]):
    """Releases items in their records' offset order, per partition."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition[T]] = {}

    def track(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition()
        if part.unreleased and offset <= part.unreleased[-1]:
            raise ValueError(f"offset {offset} of {tp} tracked out of order (last {part.unreleased[-1]})")
        part.unreleased.append(offset)

    def track_many(self, records: Iterable[tuple[TopicPartition, int]]) -> None:
        for tp, offset in records:
            self.track(tp, offset)

    def offer(self, tp: TopicPartition, offset: int, item: T) -> list[T]:
        """``item`` is ready for the record at ``offset``. Returns every item now releasable, ``item`` among
        them or not, in offset order. An offer for a forgotten partition or offset releases nothing."""
        part = self._parts.get(tp)
        if part is None or not part.unreleased or offset < part.unreleased[0]:
            return []
        if offset != part.unreleased[0]:
            part.held[offset] = item
            return []
        part.unreleased.popleft()
        ready = [item]
        held, unreleased = part.held, part.unreleased
        while unreleased and unreleased[0] in held:
            ready.append(held.pop(unreleased.popleft()))
        return ready

    def num_held(self) -> int:
        """Items ready but waiting for an earlier record (a gauge for a stuck partition)."""
        return sum(len(p.held) for p in self._parts.values())

    def forget(self, tp: TopicPartition) -> None:
        self._parts.pop(tp, None)

    def forget_all(self) -> None:
        self._parts.clear()
