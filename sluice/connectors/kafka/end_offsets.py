"""The end of a bounded read (``sluice run --until-end``): per assigned partition, where reading started, the
end offset taken when it was assigned, and how far it has been read.

Pure bookkeeping, no client calls (``bounded.py`` asks the brokers and feeds it). Per partition:

* ``end``: the partition's end offset at assignment -- the high watermark, or under ``read_committed`` the
  last stable offset, so a transaction still open then is left out. Records at or past it were produced
  after the run took its ends: they are not processed (this run commits nothing past them; the next run or
  the group's next member reads them);
* ``position``: the next offset to read, as the consumer reports it -- it moves past transaction markers,
  which are never handed out as records, so a partition whose last offset is a commit marker still ends;
* a partition is *done* once its position reaches its end. The run is over when every assigned partition is
  done (after at least one assignment) and nothing is in flight: the runner then commits and stops.

A rewind (an aborted transaction, exactly-once) moves positions back: the partitions are not done any more
until the consumer has read up to their ends again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sluice.operator.record import TopicPartition


@dataclass(slots=True)
class _Range:
    start: int  # where this assignment began reading
    end: int  # the end offset at assignment
    position: int  # the next offset to read (>= start)

    @property
    def done(self) -> bool:
        return self.position >= self.end


class EndOffsets:
    """The ranges of the assigned partitions of a bounded read. Intake thread only."""

    def __init__(self) -> None:
        self._ranges: dict[TopicPartition, _Range] = {}
        self.num_assignments = 0  # assignments seen, an empty one included (more members than partitions)

    def assign(self, ranges: dict[TopicPartition, tuple[int, int]]) -> None:
        """Partitions just assigned, with their (start, end) offsets; ``ranges`` may be empty."""
        for tp, (start, end) in ranges.items():
            self._ranges[tp] = _Range(start, end, start)
        self.num_assignments += 1

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions revoked or lost: their ranges go (a later assignment takes new ends)."""
        for tp in tps:
            self._ranges.pop(tp, None)

    def end_of(self, tp: TopicPartition) -> int | None:
        r = self._ranges.get(tp)
        return None if r is None else r.end

    def advance(self, tp: TopicPartition, position: int) -> bool:
        """The consumer's position of ``tp`` moved to ``position``. True when that made ``tp`` done."""
        r = self._ranges.get(tp)
        if r is None or r.done or position <= r.position:
            return False
        r.position = position
        return r.done

    def rewound(self, tps: Iterable[TopicPartition]) -> None:
        """``tps`` were sought back to their committed offsets: read them up to their ends again. Their exact
        positions are known again once the consumer has read from them; until then, where they started."""
        for tp in tps:
            r = self._ranges.get(tp)
            if r is not None:
                r.position = r.start

    def is_done(self, tp: TopicPartition) -> bool:
        r = self._ranges.get(tp)
        return r is not None and r.done

    def undone(self) -> list[TopicPartition]:
        return [tp for tp, r in self._ranges.items() if not r.done]

    def all_done(self) -> bool:
        """Every assigned partition has been read up to its end (False before the first assignment)."""
        return self.num_assignments > 0 and all(r.done for r in self._ranges.values())

    def remaining(self) -> dict[TopicPartition, int]:
        """Records left to read per partition, up to the ends (transaction markers counted as records)."""
        return {tp: max(0, r.end - r.position) for tp, r in self._ranges.items()}

    def total(self) -> int:
        """Records this run reads over its current assignment, start to end."""
        return sum(max(0, r.end - r.start) for r in self._ranges.values())
