"""Per-partition watermark of completed input offsets: the only offsets that may be committed.

Pure bookkeeping, no I/O. The runner calls, for each input record:

1. ``track(tp, offset)``  -- when the record is polled; it holds one reference from then on;
2. ``expect(tp, offset)`` -- optionally, to add references (e.g. one per extra output);
3. ``ack(tp, offset)``    -- once per reference: the runner acks when every output (or dead-letter record)
                             made from the record has a successful delivery report.

A record is *done* when all of its references are acknowledged. ``committable(tp)`` is the offset after the
longest run of done records at the start of the partition's outstanding offsets -- the Kafka convention
("next offset to read"). It never moves backwards, and it never passes a record that is not done, so a
crash re-processes at most what was in flight: that is the at-least-once guarantee.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from sluice.operator.record import TopicPartition


@dataclass(slots=True)
class _PartitionState:
    outstanding: dict[int, int] = field(default_factory=dict)  # offset -> references not yet acked
    order: deque[int] = field(default_factory=deque)  # tracked offsets, ascending, not yet below watermark
    watermark: int | None = None  # next offset to commit; None until the first record is done


class OffsetTracker:
    """Tracks outstanding records and computes the committable watermark per partition."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _PartitionState] = {}
        self._num_outstanding = 0

    @property
    def num_in_flight(self) -> int:
        """Records polled whose outputs are not all delivered yet (the backpressure measure)."""
        return self._num_outstanding

    def num_in_flight_of(self, tp: TopicPartition) -> int:
        """Records of ``tp`` polled and not done yet."""
        state = self._parts.get(tp)
        return 0 if state is None else len(state.outstanding)

    def track(self, tp: TopicPartition, offset: int) -> None:
        state = self._parts.get(tp)
        if state is None:
            state = self._parts[tp] = _PartitionState()
        if state.order and offset <= state.order[-1]:
            raise ValueError(f"offset {offset} of {tp} tracked out of order (last {state.order[-1]})")
        if state.watermark is not None and offset < state.watermark:
            raise ValueError(f"offset {offset} of {tp} is below the committed watermark {state.watermark}")
        state.outstanding[offset] = 1
        state.order.append(offset)
        self._num_outstanding += 1

    def track_many(self, records: Iterable[tuple[TopicPartition, int]]) -> None:
        """``track`` for each (partition, offset), in order."""
        for tp, offset in records:
            self.track(tp, offset)

    def expect(self, tp: TopicPartition, offset: int, count: int = 1) -> None:
        self._parts[tp].outstanding[offset] += count

    def ack(self, tp: TopicPartition, offset: int) -> None:
        state = self._parts.get(tp)
        if state is None or offset not in state.outstanding:
            return  # partition forgotten (revoked) after the output left: nothing to commit any more
        left = state.outstanding[offset] - 1
        if left:
            state.outstanding[offset] = left
            return
        del state.outstanding[offset]
        self._num_outstanding -= 1
        order = state.order
        while order and order[0] not in state.outstanding:
            state.watermark = order.popleft() + 1

    def ack_many(self, records: Iterable[tuple[TopicPartition, int]]) -> None:
        """``ack`` for each (partition, offset)."""
        for tp, offset in records:
            self.ack(tp, offset)

    def committable(self, tp: TopicPartition) -> int | None:
        state = self._parts.get(tp)
        return None if state is None else state.watermark

    def watermarks(self) -> dict[TopicPartition, int]:
        """Every partition's committable offset (partitions with nothing done yet are left out)."""
        return {tp: s.watermark for tp, s in self._parts.items() if s.watermark is not None}

    def is_idle(self, tp: TopicPartition | None = None) -> bool:
        """True when nothing is outstanding (on ``tp``, or anywhere)."""
        if tp is None:
            return self._num_outstanding == 0
        state = self._parts.get(tp)
        return state is None or not state.outstanding

    def forget_all(self) -> None:
        """Drop every partition (after an aborted transaction, before rewinding the consumer)."""
        self._parts.clear()
        self._num_outstanding = 0

    def forget(self, tp: TopicPartition) -> None:
        """Drop a partition (revoked or lost); late acks for it are ignored."""
        state = self._parts.pop(tp, None)
        if state is not None:
            self._num_outstanding -= len(state.outstanding)
