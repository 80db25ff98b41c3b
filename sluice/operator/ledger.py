"""The in-flight ledger: every input record between its poll and the delivery of its outputs, per partition.

It answers the three questions the operator asks about records in flight:

* **What may be committed?** Per partition, the *watermark*: the offset after the longest run of *done*
  records (every output and dead-letter record delivered) at the start of the partition's tracked offsets
  -- the Kafka convention, "next offset to read". It never moves backwards and never passes a record that
  is not done, so a crash re-processes at most what was in flight: the at-least-once guarantee.
* **How much is in flight?** In all and per partition: what backpressure pauses on.
* **May this output leave yet?** With ``in_order`` (exactly-once), an output is held back until every
  earlier record of its partition has been released. A transaction commits its outputs with the
  partition's watermark; were an output of a record *after* an unfinished one in the producer, the committed
  watermark would stop before that record and a crash or a rebalance would commit its output twice. In
  order, every output in the producer belongs to a record below the partition's first unreleased offset,
  so once the producer is flushed the watermark covers exactly the records whose outputs it holds. Records
  finish out of order for good reasons: a record that fails to decode is dead-lettered at once,
  ``bucket_by: tokens`` lets short records overtake long ones, the LLM engine finishes short answers first.

Pure bookkeeping, no I/O, no locking (the caller holds the operator's lock). The life of a record:

1. ``track_many`` when it is polled, before anything can be produced for it (offsets ascend per partition);
2. ``release`` when its output (or dead-letter record) is ready: returns what may be produced now;
3. ``ack_many`` once every output of the records produced together has a successful delivery report;
4. ``watermarks`` is what the delivery strategy stores or commits;
5. ``forget`` / ``forget_all`` when partitions are revoked, lost or rewound: their records and held outputs
   are dropped (their next owner, or the rewound consumer, processes them again); late acks are ignored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sluice.operator.record import TopicPartition


class Placed(Protocol):
    """Where a record came from (an :class:`~sluice.operator.record.InputRecord` is one)."""

    @property
    def tp(self) -> TopicPartition: ...
    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=Placed)  # the records tracked
T = TypeVar("T")  # what is produced per record (an output record)


@dataclass(slots=True)
class _Partition(Generic[R, T]):
    outstanding: set[int] = field(default_factory=set)  # tracked offsets not done yet
    order: deque[int] = field(default_factory=deque)  # tracked offsets, ascending, not yet below the watermark
    last: int = -1  # the last offset tracked: the next must be above it
    watermark: int | None = None  # next offset to commit; None until the first record is done
    unreleased: deque[int] = field(default_factory=deque)  # in_order: tracked offsets not released yet
    held: dict[int, tuple[R, T, bool]] = field(default_factory=dict)  # in_order: ready, waiting for earlier


class InFlightLedger(Generic[R, T]):
    """Records in flight per partition, their watermark, and (``in_order``) the in-order release of outputs.
    ``R``: the records (anything with ``tp`` and ``offset``); ``T``: what is produced per record."""

    def __init__(self, in_order: bool = False) -> None:
        self.in_order = in_order
        self._parts: dict[TopicPartition, _Partition[R, T]] = {}
        self._num_in_flight = 0

    # ------------------------------------------------------------------------------------------ counts

    @property
    def num_in_flight(self) -> int:
        """Records polled whose outputs are not all delivered yet (the backpressure measure)."""
        return self._num_in_flight

    def num_in_flight_of(self, tp: TopicPartition) -> int:
        part = self._parts.get(tp)
        return 0 if part is None else len(part.outstanding)

    def is_idle(self) -> bool:
        """True when nothing is in flight."""
        return self._num_in_flight == 0

    # --------------------------------------------------------------------------------------- lifecycle

    def track_many(self, records: Iterable[R]) -> None:
        """Records just polled, in offset order per partition. Raises ValueError on an offset at or below one
        already tracked (a bug: the same record would be produced twice)."""
        parts, in_order = self._parts, self.in_order
        last_tp: TopicPartition | None = None
        part: _Partition[R, T] | None = None
        num = 0
        for r in records:
            tp, offset = r.tp, r.offset
            if tp is not last_tp or part is None:  # one poll's records come in runs per partition
                part = parts.get(tp)
                if part is None:
                    part = parts[tp] = _Partition()
                last_tp = tp
            if offset <= part.last:
                raise ValueError(f"offset {offset} of {tp} tracked out of order (last {part.last})")
            part.last = offset
            part.outstanding.add(offset)
            part.order.append(offset)
            if in_order:
                part.unreleased.append(offset)
            num += 1
        self._num_in_flight += num

    def release(self, records: list[R], outputs: list[T], num_results: int) -> tuple[list[R], list[T], int]:
        """Outputs ready for ``records`` (one each; the first ``num_results`` are results, the rest dead
        letters). Returns what may be produced now -- (records, outputs, how many of them are dead letters)
        -- in offset order per partition: without ``in_order`` everything given, as given; with it, only
        outputs whose every earlier record of their partition is released, including outputs held back
        before. Outputs of forgotten partitions are dropped."""
        if not self.in_order:
            return records, outputs, len(outputs) - num_results
        out_records: list[R] = []
        out_outputs: list[T] = []
        num_dead = 0
        parts = self._parts
        for i, (r, output) in enumerate(zip(records, outputs, strict=True)):
            part = parts.get(r.tp)
            if part is None or not part.unreleased or r.offset < part.unreleased[0]:
                continue  # forgotten (revoked, lost, rewound): whoever reads it next produces it
            if r.offset != part.unreleased[0]:
                part.held[r.offset] = (r, output, i >= num_results)
                continue
            part.unreleased.popleft()
            out_records.append(r)
            out_outputs.append(output)
            num_dead += i >= num_results
            held, unreleased = part.held, part.unreleased
            while unreleased and unreleased[0] in held:
                held_record, held_output, dead = held.pop(unreleased.popleft())
                out_records.append(held_record)
                out_outputs.append(held_output)
                num_dead += dead
        return out_records, out_outputs, num_dead

    def ack_many(self, records: Iterable[R]) -> None:
        """Every output of ``records`` is delivered: they are done. Records of forgotten partitions (revoked
        after their outputs left) are ignored: nothing of theirs is committed any more."""
        parts = self._parts
        num = 0
        for r in records:
            part = parts.get(r.tp)
            if part is None:
                continue
            outstanding = part.outstanding
            offset = r.offset
            if offset not in outstanding:
                continue
            outstanding.remove(offset)
            num += 1
            order = part.order
            if order[0] == offset:  # the watermark moves only when the earliest record is done
                while order and order[0] not in outstanding:
                    part.watermark = order.popleft() + 1
        self._num_in_flight -= num

    def watermarks(self) -> dict[TopicPartition, int]:
        """Every partition's committable offset (partitions with nothing done yet are left out)."""
        return {tp: p.watermark for tp, p in self._parts.items() if p.watermark is not None}

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop partitions (revoked or lost): their records, their held outputs; late acks are ignored."""
        for tp in tps:
            part = self._parts.pop(tp, None)
            if part is not None:
                self._num_in_flight -= len(part.outstanding)

    def forget_all(self) -> None:
        """Drop every partition (an aborted transaction: the consumer is rewound to the committed offsets)."""
        self._parts.clear()
        self._num_in_flight = 0
